// Package docscheck checks the project's Markdown so that the docs cannot
// rot silently: every relative link names a file that exists, every #anchor
// names a heading (by GitHub's slug rules) of the page it points into, and
// every Go code block written as a whole file (its first line starts with
// "package") compiles against the checkout. Go blocks that do not start with
// "package" are fragments and are not compiled; examples that must run are
// Example functions in _test.go files, which the docs link to.
//
// Its test (TestRepositoryDocs) runs the checks on the repository.
package docscheck

import (
	"bufio"
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// Page is one parsed Markdown file.
type Page struct {
	// Path is the file's path relative to the repository root, with
	// forward slashes.
	Path string
	// Anchors holds the fragment ids the page defines: its headings'
	// GitHub slugs (with -1, -2 ... for repeats) and explicit
	// <a id="..."> or <a name="..."> anchors.
	Anchors map[string]bool
	// Links are the link and image targets outside code.
	Links []Link
	// GoBlocks are the fenced code blocks whose info string is "go".
	GoBlocks []Block
}

// Link is one link target and the line it is on.
type Link struct {
	Line   int
	Target string
}

// Block is a fenced code block: Line is the line of its opening fence,
// Code its content.
type Block struct {
	Line int
	Code string
}

// Problem is one broken link, anchor or code block.
type Problem struct {
	File string
	Line int
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

var (
	fenceRe    = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})\\s*([^`\\s]*)")
	headingRe  = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	codeSpanRe = regexp.MustCompile("`+[^`]*`+")
	// inline links and images: [text](target "title"); the text may hold
	// one level of brackets (images inside links, [`x`]).
	linkRe     = regexp.MustCompile(`\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRe   = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	htmlSrcRe  = regexp.MustCompile(`<(?:img|a)\s[^>]*(?:src|href)="([^"]+)"`)
	// markup removed from a heading before it is slugged
	imageRe = regexp.MustCompile(`!\[([^\]]*)\]\([^)]*\)`)
	inlineL = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	htmlTag = regexp.MustCompile(`<[^>]+>`)
)

// Parse reads one Markdown page. path is the page's path relative to the
// repository root.
func Parse(path string, src []byte) *Page {
	p := &Page{Path: filepath.ToSlash(path), Anchors: map[string]bool{}}
	seen := map[string]int{}
	var (
		fence     string // the open fence's marker, "" outside a block
		block     *Block
		blockBody strings.Builder
	)
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := fenceRe.FindStringSubmatch(line); m != nil {
			switch {
			case fence == "":
				fence = m[1]
				if m[2] == "go" {
					block = &Block{Line: n}
					blockBody.Reset()
				}
				continue
			case m[2] == "" && m[1][0] == fence[0] && len(m[1]) >= len(fence):
				fence = ""
				if block != nil {
					block.Code = blockBody.String()
					p.GoBlocks = append(p.GoBlocks, *block)
					block = nil
				}
				continue
			}
		}
		if fence != "" {
			if block != nil {
				blockBody.WriteString(line)
				blockBody.WriteByte('\n')
			}
			continue
		}
		if m := headingRe.FindStringSubmatch(line); m != nil {
			s := Slug(m[2])
			if k := seen[s]; k > 0 {
				p.Anchors[fmt.Sprintf("%s-%d", s, k)] = true
			} else {
				p.Anchors[s] = true
			}
			seen[s]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			p.Anchors[m[1]] = true
		}
		text := codeSpanRe.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat(" ", len(s)) })
		for _, re := range []*regexp.Regexp{linkRe, refDefRe, htmlSrcRe} {
			for _, m := range re.FindAllStringSubmatch(text, -1) {
				p.Links = append(p.Links, Link{Line: n, Target: m[1]})
			}
		}
	}
	return p
}

// Slug is the fragment id GitHub gives a heading of this text: the text
// as rendered (code spans, emphasis and links reduced to their text),
// lower-cased, with every character that is not a letter, a digit, a
// mark, '_', '-' or a space removed, and each space turned into '-'.
// Repeated slugs on one page get -1, -2 ... (see Parse).
func Slug(heading string) string {
	s := imageRe.ReplaceAllString(heading, "$1")
	s = inlineL.ReplaceAllString(s, "$1")
	s = htmlTag.ReplaceAllString(s, "")
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Load parses every Markdown file under root, skipping directories whose
// name starts with '.' or is testdata.
func Load(root string) (map[string]*Page, error) {
	pages := map[string]*Page{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(d.Name(), ".md") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		pages[filepath.ToSlash(rel)] = Parse(rel, src)
		return nil
	})
	return pages, err
}

// CheckLinks reports every relative link of pages whose file does not
// exist under root, and every #anchor that the Markdown page it points
// into does not define. Links with a scheme (https:, mailto:) are not
// followed.
func CheckLinks(root string, pages map[string]*Page) []Problem {
	var probs []Problem
	for _, name := range sortedKeys(pages) {
		p := pages[name]
		for _, l := range p.Links {
			if msg := checkLink(root, pages, p, l.Target); msg != "" {
				probs = append(probs, Problem{File: p.Path, Line: l.Line, Msg: msg})
			}
		}
	}
	return probs
}

func checkLink(root string, pages map[string]*Page, from *Page, target string) string {
	if u, err := url.Parse(target); err == nil && u.Scheme != "" {
		return ""
	}
	file, frag, _ := strings.Cut(target, "#")
	file, err := url.PathUnescape(file)
	if err != nil {
		return fmt.Sprintf("link %q: %v", target, err)
	}
	dest := from
	if file != "" {
		if strings.HasPrefix(file, "/") {
			return fmt.Sprintf("link %q: absolute path; use one relative to %s", target, from.Path)
		}
		rel := filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(from.Path), file)))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return fmt.Sprintf("link %q: leaves the repository", target)
		}
		if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
			return fmt.Sprintf("link %q: no file %s", target, rel)
		}
		dest = pages[rel]
	}
	if frag == "" || dest == nil {
		return "" // no anchor, or one into a file that is not Markdown (a line of a source file)
	}
	if !dest.Anchors[frag] {
		return fmt.Sprintf("link %q: %s has no heading or anchor %q%s", target, dest.Path, frag, near(dest, frag))
	}
	return ""
}

// near names the page's anchors that share a word with frag, to help fix
// a link broken by a renamed heading.
func near(p *Page, frag string) string {
	var alts []string
	for a := range p.Anchors {
		for _, w := range strings.Split(frag, "-") {
			if len(w) > 3 && strings.Contains(a, w) {
				alts = append(alts, a)
				break
			}
		}
	}
	if len(alts) == 0 {
		return ""
	}
	sort.Strings(alts)
	return " (it has " + strings.Join(alts, ", ") + ")"
}

// WholeFile reports whether a Go block is a whole file, to be compiled:
// its first non-blank line starts with "package ".
func WholeFile(b Block) bool {
	for _, l := range strings.Split(b.Code, "\n") {
		if strings.TrimSpace(l) != "" {
			return strings.HasPrefix(l, "package ")
		}
	}
	return false
}

// CompileBlocks compiles every whole-file Go block of pages, each as a
// package of its own, in a temporary module that requires the module at
// root (the checkout, whatever the pages' directory) through a replace
// directive. Dependencies come from the module cache, or from GOPROXY
// where the cache lacks one (a test run of a few packages on a fresh machine
// has not downloaded what the nested modules need), checked against the
// go.sum files of root and its nested modules. It returns the compiler's report, naming each block's page and line.
func CompileBlocks(root string, pages map[string]*Page) ([]Problem, error) {
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	modPath, err := modulePath(absRoot)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "docscheck")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	type origin struct {
		page string
		line int
	}
	origins := map[string]origin{}
	for _, name := range sortedKeys(pages) {
		for _, b := range pages[name].GoBlocks {
			if !WholeFile(b) {
				continue
			}
			pkg := fmt.Sprintf("b%03d", len(origins))
			origins[pkg] = origin{name, b.Line}
			if err := os.Mkdir(filepath.Join(dir, pkg), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(dir, pkg, "block.go"), []byte(b.Code), 0o644); err != nil {
				return nil, err
			}
		}
	}
	if len(origins) == 0 {
		return nil, nil
	}
	// The modules nested in root (otel, metrics ...) are replaced by their
	// directories too, so that a block may import them; go.sum holds the
	// sums of all of them.
	nested, err := nestedModules(absRoot)
	if err != nil {
		return nil, err
	}
	gomod := fmt.Sprintf("module docscheck.invalid/blocks\n\ngo 1.26\n\nrequire %s v0.0.0\n\nreplace %s => %s\n", modPath, modPath, absRoot)
	sums := map[string]bool{}
	var sum []byte
	for _, m := range append([]module{{modPath, absRoot}}, nested...) {
		if m.dir != absRoot {
			gomod += fmt.Sprintf("\nreplace %s => %s\n", m.path, m.dir)
		}
		src, err := os.ReadFile(filepath.Join(m.dir, "go.sum"))
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		for _, l := range strings.SplitAfter(string(src), "\n") {
			if l != "" && !sums[l] {
				sums[l] = true
				sum = append(sum, l...)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		return nil, err
	}
	args := []string{"build"}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir = dir
	// -mod=mod lets go add the requirements the blocks' imports need (all in
	// root's build list).
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil, nil
	}
	if _, ok := err.(*exec.ExitError); !ok {
		return nil, fmt.Errorf("go build: %w", err)
	}
	// Lines such as "./b001/block.go:12:5: undefined: x" name a block and a
	// line in it: report them at the page's line.
	var probs []Problem
	loc := regexp.MustCompile(`^(?:\./)?(b\d{3})/block\.go:(\d+)(?::\d+)?: (.*)$`)
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if m := loc.FindStringSubmatch(l); m != nil {
			o := origins[m[1]]
			n, _ := strconv.Atoi(m[2]) // digits, by the pattern
			probs = append(probs, Problem{File: o.page, Line: o.line + n, Msg: "go block does not compile: " + m[3]})
		}
	}
	if len(probs) == 0 {
		probs = append(probs, Problem{File: "(go build)", Msg: strings.TrimSpace(string(out))})
	}
	return probs, nil
}

// module is a Go module of the repository: its path and directory.
type module struct{ path, dir string }

// nestedModules returns the modules in directories below root (each with a
// go.mod of its own), skipping hidden directories and testdata.
func nestedModules(root string) ([]module, error) {
	var mods []module
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() || path == root {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); err != nil {
			return nil
		}
		mp, err := modulePath(path)
		if err != nil {
			return err
		}
		mods = append(mods, module{mp, path})
		return nil
	})
	return mods, err
}

func modulePath(root string) (string, error) {
	src, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(src), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s/go.mod: no module line", root)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
