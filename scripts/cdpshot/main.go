// Command cdpshot loads a page in headless Chromium, waits in real time
// until JavaScript conditions hold, prints a JSON report the page computes
// and saves a screenshot. It speaks the Chrome DevTools Protocol over a
// WebSocket (golang.org/x/net/websocket), so it needs nothing but a
// Chromium binary. scripts/browser-test.sh uses it for the live page of
// router_example: `chromium --screenshot` shoots right after the load
// event, before a page that polls its data has drawn much.
//
//	cdpshot -url http://127.0.0.1:8080/ -out live.png \
//	  -ready 'document.body.dataset.rendered === "true"' \
//	  -prefer 'document.querySelector(".row.held") !== null' -min-wait 10s
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/websocket"
)

// chromiumFlags are the flags headless Chromium needs on a machine without
// a display or outside network: no sandbox (root), no GPU, and no
// background connections to Google's services.
var chromiumFlags = []string{
	"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
	"--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
}

func main() {
	chromium := flag.String("chromium", "", "Chromium binary (default: chromium, chromium-browser or google-chrome on PATH)")
	pageURL := flag.String("url", "", "page to load")
	out := flag.String("out", "screenshot.png", "where to write the PNG screenshot")
	width := flag.Int("width", 1280, "viewport width")
	height := flag.Int("height", 800, "viewport height")
	ready := flag.String("ready", "document.readyState === 'complete'", "JavaScript expression that must become true (else failure)")
	prefer := flag.String("prefer", "", "JavaScript expression worth waiting for, up to -prefer-timeout (no failure when it stays false)")
	preferTimeout := flag.Duration("prefer-timeout", 20*time.Second, "how long to wait for -prefer")
	minWait := flag.Duration("min-wait", 0, "wait at least this long after loading before the screenshot")
	report := flag.String("report", "", "JavaScript expression whose value is printed as JSON on stdout")
	timeout := flag.Duration("timeout", 60*time.Second, "overall limit")
	flag.Parse()
	if *pageURL == "" {
		fail(errors.New("-url is required"))
	}
	bin := *chromium
	if bin == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				bin = p
				break
			}
		}
		if bin == "" {
			fail(errors.New("no Chromium on PATH; pass -chromium"))
		}
	}
	deadline := time.Now().Add(*timeout)

	b, err := launch(bin, *width, *height)
	if err != nil {
		fail(err)
	}
	defer b.close()

	page, err := b.page()
	if err != nil {
		fail(err)
	}
	defer page.ws.Close()
	must(page.call("Emulation.setDeviceMetricsOverride", map[string]any{
		"width": *width, "height": *height, "deviceScaleFactor": 1, "mobile": false,
	}, nil))
	must(page.call("Page.enable", nil, nil))
	loadedAt := time.Now()
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	must(page.call("Page.navigate", map[string]any{"url": *pageURL}, &nav))
	if nav.ErrorText != "" {
		fail(fmt.Errorf("loading %s: %s", *pageURL, nav.ErrorText))
	}

	if ok, err := page.waitTrue(*ready, deadline); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("timed out waiting for %s", *ready)
		}
		fail(err)
	}
	if *prefer != "" {
		until := time.Now().Add(*preferTimeout)
		if until.After(deadline) {
			until = deadline
		}
		if ok, err := page.waitTrue(*prefer, until); err != nil {
			fail(err)
		} else if !ok {
			fmt.Fprintf(os.Stderr, "cdpshot: %s did not become true within %v; shooting anyway\n", *prefer, *preferTimeout)
		}
	}
	if rest := *minWait - time.Since(loadedAt); rest > 0 {
		time.Sleep(rest)
	}
	if *report != "" {
		v, err := page.eval(*report)
		if err != nil {
			fail(err)
		}
		enc, _ := json.Marshal(v)
		fmt.Println(string(enc))
	}
	var shot struct {
		Data string `json:"data"`
	}
	must(page.call("Page.captureScreenshot", map[string]any{"format": "png"}, &shot))
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		fail(fmt.Errorf("decoding the screenshot: %w", err))
	}
	must(os.WriteFile(*out, png, 0o644))
	fmt.Fprintf(os.Stderr, "cdpshot: %d bytes written to %s\n", len(png), *out)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "cdpshot:", err)
	os.Exit(1)
}

func must(err error) {
	if err != nil {
		fail(err)
	}
}

// browser is a headless Chromium started by launch.
type browser struct {
	cmd     *exec.Cmd
	dataDir string
	http    string // host:port of the DevTools HTTP endpoint
	wsURL   string // the browser target
}

var devtoolsLine = regexp.MustCompile(`DevTools listening on (ws://([^/\s]+)/\S+)`)

func launch(bin string, width, height int) (*browser, error) {
	dir, err := os.MkdirTemp("", "cdpshot-profile-")
	if err != nil {
		return nil, err
	}
	args := append([]string{}, chromiumFlags...)
	args = append(args,
		"--user-data-dir="+dir,
		"--remote-debugging-port=0",
		"--remote-allow-origins=*",
		fmt.Sprintf("--window-size=%d,%d", width, height),
		"about:blank",
	)
	cmd := exec.Command(bin, args...)
	// Its own process group, so that close ends its helpers too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	b := &browser{cmd: cmd, dataDir: dir}
	found := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			if m := devtoolsLine.FindStringSubmatch(sc.Text()); m != nil && !sent {
				found <- m
				sent = true
			}
		}
		if !sent {
			close(found)
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case m, ok := <-found:
		if !ok {
			b.close()
			return nil, errors.New("chromium exited before its DevTools endpoint was up")
		}
		b.wsURL, b.http = m[1], m[2]
	case <-time.After(30 * time.Second):
		b.close()
		return nil, errors.New("chromium did not announce its DevTools endpoint within 30s")
	}
	return b, nil
}

// page connects to the browser's first page target.
func (b *browser) page() (*session, error) {
	var targets []struct {
		Type string `json:"type"`
		WS   string `json:"webSocketDebuggerUrl"`
	}
	for attempt := 0; attempt < 50; attempt++ {
		resp, err := http.Get("http://" + b.http + "/json/list")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&targets)
			resp.Body.Close()
		}
		if err == nil {
			for _, t := range targets {
				if t.Type == "page" && t.WS != "" {
					return dial(t.WS)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, errors.New("no page target in the browser")
}

// close asks the browser to quit, then ends its process group.
func (b *browser) close() {
	if b.wsURL != "" {
		if s, err := dial(b.wsURL); err == nil {
			_ = s.ws.SetDeadline(time.Now().Add(2 * time.Second))
			_ = websocket.JSON.Send(s.ws, map[string]any{"id": 1, "method": "Browser.close"})
			s.ws.Close()
		}
	}
	done := make(chan struct{})
	go func() {
		_ = b.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	os.RemoveAll(b.dataDir)
}

// session is a DevTools connection to one target.
type session struct {
	ws *websocket.Conn
	id int
}

func dial(wsURL string) (*session, error) {
	u, err := url.Parse(wsURL)
	if err != nil {
		return nil, err
	}
	ws, err := websocket.Dial(wsURL, "", "http://"+u.Host)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", wsURL, err)
	}
	ws.MaxPayloadBytes = 64 << 20 // screenshots
	return &session{ws: ws}, nil
}

// call sends one command and waits for its answer, skipping events.
func (s *session) call(method string, params any, result any) error {
	s.id++
	req := map[string]any{"id": s.id, "method": method}
	if params != nil {
		req["params"] = params
	}
	if err := s.ws.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	if err := websocket.JSON.Send(s.ws, req); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	for {
		var msg struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := websocket.JSON.Receive(s.ws, &msg); err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
		if msg.ID != s.id {
			continue // an event, or a stale answer
		}
		if msg.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, msg.Error.Message, msg.Error.Code)
		}
		if result != nil {
			return json.Unmarshal(msg.Result, result)
		}
		return nil
	}
}

// eval evaluates a JavaScript expression in the page and returns its value.
func (s *session) eval(expr string) (any, error) {
	var res struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	err := s.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &res)
	if err != nil {
		return nil, err
	}
	if res.Exception != nil {
		return nil, fmt.Errorf("evaluating %q: %s", expr, strings.TrimSpace(res.Exception.Text))
	}
	return res.Result.Value, nil
}

// waitTrue polls expr every 100ms until it is true or until passes. An
// expression that throws (the page is still loading) counts as false; the
// last such error is returned when time runs out.
func (s *session) waitTrue(expr string, until time.Time) (bool, error) {
	for {
		v, err := s.eval("Boolean(" + expr + ")")
		if b, _ := v.(bool); err == nil && b {
			return true, nil
		}
		if time.Now().After(until) {
			return false, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
