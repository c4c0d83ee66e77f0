package safeack_test

import (
	"flag"
	"io"
	"log"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// testsAtOnce is how many parallel tests run at once per CPU when the
// command line does not say (-parallel): the tests mostly wait (on the
// group protocol, on timers, on a broker's answer), not compute, so
// -parallel's own default, GOMAXPROCS, left two cores idle most of a run.
// Not more: with another suite beside it, six per CPU starved the tests
// whose sessions last 1-3 s.
const testsAtOnce = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(testsAtOnce*runtime.GOMAXPROCS(0)))
	}
	if !testing.Verbose() && os.Getenv("SAFEACK_TEST_DEBUG") == "" {
		// Watermill's universal suite logs a line per bulk read with the
		// standard logger: hundreds of lines above a failure.
		log.SetOutput(io.Discard)
	}
	os.Exit(m.Run())
}
