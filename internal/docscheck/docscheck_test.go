package docscheck

import (
	"go/ast"
	"go/build"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository's root, seen from this package's directory.
const root = "../.."

// TestRepositoryDocs fails on a broken relative link or anchor in any
// Markdown file of the repository, and on a whole-file Go block (one that
// starts with "package") that does not compile.
func TestRepositoryDocs(t *testing.T) {
	pages, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, need := range []string{"README.md", "docs/guarantees.md"} {
		if pages[need] == nil {
			t.Fatalf("%s not found under %s", need, root)
		}
	}
	for _, p := range CheckLinks(root, pages) {
		t.Error(p)
	}
	if testing.Short() {
		t.Log("-short: Go blocks not compiled")
		return
	}
	probs, err := CompileBlocks(root, pages)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Error(p)
	}
}

// TestReadme keeps the README what issue 27 made it: short (the rest
// belongs in docs/), and holding the test command CI runs, exactly. The
// bound was 250 lines until issue 38 put a complete first program (45
// lines, examples/first/main.go) in it.
func TestReadme(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(src), "\n"); n > 275 {
		t.Errorf("README.md has %d lines, more than 275: move detail to a page in docs/", n)
	}
	if !regexp.MustCompile(`(?m)^go test -race -timeout 10m work\s`).Match(src) {
		t.Error("README.md lost the line starting with the test command CI runs: go test -race -timeout 10m work")
	}
}

// TestDocsPagesReachable: every page in docs/ is linked from the README,
// and named in the package documentation (go doc), so that a reader coming
// from either finds it. Pages in subfolders of docs/ (docs/upstream: reports
// for other projects) are reached from the page that needs them instead.
func TestDocsPagesReachable(t *testing.T) {
	pages, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, l := range pages["README.md"].Links {
		file, _, _ := strings.Cut(l.Target, "#")
		linked[filepath.ToSlash(filepath.Clean(file))] = true
	}
	pkgDoc := packageDoc(t, root)
	for name := range pages {
		if !strings.HasPrefix(name, "docs/") || strings.Contains(strings.TrimPrefix(name, "docs/"), "/") {
			continue
		}
		if !linked[name] {
			t.Errorf("%s is not linked from README.md", name)
		}
		if !strings.Contains(pkgDoc, name) {
			t.Errorf("%s is not named in the package documentation (doc.go)", name)
		}
	}
}

// TestExportedDocsStartWithName: the doc comment of every exported
// top-level identifier and method of the module's public packages starts
// with its name ("A"/"An"/"The" may come first for a type), as go doc and
// pkg.go.dev readers expect. Within a parenthesized const or var group
// with a group comment, specs may go without a doc of their own.
func TestExportedDocsStartWithName(t *testing.T) {
	for _, dir := range publicPackageDirs(t, root) {
		fset, files, name := parsePackage(t, dir)
		if name == "main" {
			continue
		}
		d, err := doc.NewFromFiles(fset, files, "example.invalid/"+name)
		if err != nil {
			t.Fatal(err)
		}
		check := func(kind, name, text string, articles bool) {
			if !startsWithName(text, name, articles) {
				first, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
				t.Errorf("%s: %s %s: doc does not start with its name: %q", dir, kind, name, first)
			}
		}
		values := func(kind string, vals []*doc.Value) {
			for _, v := range vals {
				for _, spec := range v.Decl.Specs {
					vs := spec.(*ast.ValueSpec)
					for _, n := range vs.Names {
						if !n.IsExported() {
							continue
						}
						text := vs.Doc.Text()
						if text == "" && len(v.Decl.Specs) > 1 && v.Doc != "" {
							continue // documented by its group
						}
						if text == "" {
							text = v.Doc
						}
						check(kind, n.Name, text, false)
					}
				}
			}
		}
		values("const", d.Consts)
		values("var", d.Vars)
		for _, f := range d.Funcs {
			check("func", f.Name, f.Doc, false)
		}
		for _, ty := range d.Types {
			check("type", ty.Name, ty.Doc, true)
			values("const", ty.Consts)
			values("var", ty.Vars)
			for _, f := range ty.Funcs {
				check("func", f.Name, f.Doc, false)
			}
			for _, f := range ty.Methods {
				check("method "+ty.Name+".", f.Name, f.Doc, false)
			}
		}
	}
}

func startsWithName(text, name string, articles bool) bool {
	words := strings.Fields(text)
	if articles && len(words) > 1 && (words[0] == "A" || words[0] == "An" || words[0] == "The") {
		words = words[1:]
	}
	return len(words) > 0 && (strings.TrimRight(words[0], ",.:;") == name || words[0] == "Deprecated:")
}

// publicPackageDirs lists the directories of the repository's
// non-internal packages, those of its nested modules (otel, metrics)
// included; commands (package main) are skipped by the caller.
func publicPackageDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root {
			if strings.HasPrefix(name, ".") || name == "testdata" || name == "internal" {
				return filepath.SkipDir
			}
		}
		goFiles, _ := filepath.Glob(filepath.Join(path, "*.go"))
		for _, f := range goFiles {
			if !strings.HasSuffix(f, "_test.go") {
				dirs = append(dirs, path)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// parsePackage parses the non-test Go files of the package in dir that
// the default build context selects (build tags included).
func parsePackage(t *testing.T, dir string) (*token.FileSet, []*ast.File, string) {
	t.Helper()
	bp, err := build.ImportDir(dir, 0)
	if _, ok := err.(*build.NoGoError); ok {
		return token.NewFileSet(), nil, "" // only files of other build tags
	}
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return fset, files, bp.Name
}

// packageDoc returns the root package's documentation as go doc shows it.
func packageDoc(t *testing.T, dir string) string {
	t.Helper()
	_, files, _ := parsePackage(t, dir)
	var b strings.Builder
	for _, f := range files {
		if f.Doc != nil {
			b.WriteString(f.Doc.Text())
		}
	}
	return b.String()
}

// TestNamedExamplesExist: every Example function the docs or the package
// documentation name (ExampleNewSubscriber, Example_routerMiddleware ...)
// exists in some _test.go file, so a renamed example cannot leave the docs
// pointing at nothing.
func TestNamedExamplesExist(t *testing.T) {
	defined := map[string]bool{}
	defRe := regexp.MustCompile(`(?m)^func (Example\w*)\(\)`)
	var texts []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if !strings.HasSuffix(name, ".md") && !strings.HasSuffix(name, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.HasSuffix(name, "_test.go") {
			for _, m := range defRe.FindAllStringSubmatch(string(src), -1) {
				defined[m[1]] = true
			}
		} else if strings.HasSuffix(name, ".md") || name == "doc.go" {
			texts = append(texts, path+"\x00"+string(src))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	useRe := regexp.MustCompile(`\bExample[A-Z_]\w*`)
	for _, text := range texts {
		path, src, _ := strings.Cut(text, "\x00")
		for _, name := range useRe.FindAllString(src, -1) {
			if !defined[name] {
				t.Errorf("%s names %s, which no _test.go file defines", path, name)
			}
		}
	}
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Where a partition starts", "where-a-partition-starts"},
		{"Connecting, and readiness", "connecting-and-readiness"},
		{"With Watermill's router middleware", "with-watermills-router-middleware"},
		{"Exactly-once Kafka-to-Kafka routers", "exactly-once-kafka-to-kafka-routers"},
		{"A three-node cluster: leader and coordinator failover", "a-three-node-cluster-leader-and-coordinator-failover"},
		{"`OffsetNewest` and `Offsets.Initial`", "offsetnewest-and-offsetsinitial"},
		{"Real Kafka – and [chaos](chaos.md)", "real-kafka--and-chaos"},
		{"snake_case 4.2+", "snake_case-42"},
	} {
		if got := Slug(c.in); got != c.want {
			t.Errorf("Slug(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParse(t *testing.T) {
	src := "# Title\n\n## Part\n\n## Part\n\n<a id=\"here\"></a>\n" +
		"See [a](a.md#x), ![img](p.png) and `[not](a link)`.\n\n" +
		"```go\npackage x\n// [not](either)\n```\n\n~~~sh\n# not a heading\n~~~\n\n[ref]: ../b.md\n"
	p := Parse("docs/p.md", []byte(src))
	for _, a := range []string{"title", "part", "part-1", "here"} {
		if !p.Anchors[a] {
			t.Errorf("anchor %q missing from %v", a, p.Anchors)
		}
	}
	if p.Anchors["not-a-heading"] {
		t.Error("a comment in a code block was taken for a heading")
	}
	var targets []string
	for _, l := range p.Links {
		targets = append(targets, l.Target)
	}
	if got, want := strings.Join(targets, " "), "a.md#x p.png ../b.md"; got != want {
		t.Errorf("links %q, want %q", got, want)
	}
	if len(p.GoBlocks) != 1 || p.GoBlocks[0].Line != 10 || !WholeFile(p.GoBlocks[0]) {
		t.Errorf("go blocks %+v, want one whole file at line 10", p.GoBlocks)
	}
}

// TestCheckLinksReportsBroken runs CheckLinks and CompileBlocks on a small
// tree with one broken link, one broken anchor and one block that does not
// compile, so that the repository test cannot pass by checking nothing.
func TestCheckLinksReportsBroken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# R\n[ok](docs/a.md#part) [gone](docs/none.md) [bad](docs/a.md#nope) [web](https://example.com/x#y)\n")
	write("docs/a.md", "# A\n## Part\n[up](../README.md#r) [self](#part)\n")
	pages, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range CheckLinks(dir, pages) {
		got = append(got, p.String())
	}
	want := regexp.MustCompile(`^README\.md:2: link "docs/none\.md": no file docs/none\.md\nREADME\.md:2: link "docs/a\.md#nope": docs/a\.md has no heading or anchor "nope"`)
	if len(got) != 2 || !want.MatchString(strings.Join(got, "\n")) {
		t.Errorf("problems:\n%s", strings.Join(got, "\n"))
	}

	if testing.Short() {
		return
	}
	write("docs/b.md", "```go\npackage ok\n\nimport \"github.com/safeack/safeack\"\n\nvar _ = safeack.OrderByKey\n```\n\n"+
		"```go\npackage bad\n\nimport \"github.com/safeack/safeack\"\n\nvar _ = safeack.NoSuchThing\n```\n\n```go\nfragment := 1\n```\n")
	pages, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	probs, err := CompileBlocks(root, map[string]*Page{"docs/b.md": pages["docs/b.md"]})
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 1 || probs[0].File != "docs/b.md" || probs[0].Line != 14 || !strings.Contains(probs[0].Msg, "NoSuchThing") {
		t.Errorf("compile problems %v, want one at docs/b.md:14 naming NoSuchThing", probs)
	}
}
