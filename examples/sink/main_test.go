package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/internal/safeacktest"
)

// The sink's tests run it on the embedded broker against a real SQLite
// file, and check at the broker that no commit passes a record without
// its row: each OffsetCommit request is inspected as the broker receives
// it, by counting the committing partition's rows below the committed
// offset in the database at that moment.

// runMain makes the test binary run main (with the flags in argsEnv)
// instead of the tests, so that a test can kill it as a process.
const (
	runMain = "SAFEACK_SINK_MAIN"
	argsEnv = "SAFEACK_SINK_ARGS"
)

func TestMain(m *testing.M) {
	if os.Getenv(runMain) == "1" {
		os.Args = append(os.Args[:1], strings.Fields(os.Getenv(argsEnv))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const wait = 60 * time.Second // deadline of every wait

// commitCheck counts, for every commit of group on topic the broker
// receives, the rows below the committed offset: offsets start at 0 and
// have no holes here, so a commit of offset o needs o rows.
type commitCheck struct {
	mu         sync.Mutex
	checked    int
	violations []string
}

func checkCommits(t *testing.T, c *kafkatest.Cluster, st *store, group, topic string) *commitCheck {
	chk := &commitCheck{}
	c.InspectCommits(t, func(oc kafkatest.ObservedCommit) {
		if oc.Group != group {
			return
		}
		for tp, co := range oc.Offsets {
			if tp.Topic != topic || co.Offset <= 0 {
				continue
			}
			n, err := st.countBelow(context.Background(), topic, tp.Partition, co.Offset)
			chk.mu.Lock()
			chk.checked++
			switch {
			case err != nil:
				chk.violations = append(chk.violations, fmt.Sprintf("partition %d: counting rows: %v", tp.Partition, err))
			case n != co.Offset:
				chk.violations = append(chk.violations, fmt.Sprintf("partition %d committed %d with %d rows below it", tp.Partition, co.Offset, n))
			}
			chk.mu.Unlock()
		}
	})
	return chk
}

// count returns how many partition commits were checked.
func (chk *commitCheck) count() int {
	chk.mu.Lock()
	defer chk.mu.Unlock()
	return chk.checked
}

func (chk *commitCheck) assert(t *testing.T) {
	t.Helper()
	chk.mu.Lock()
	defer chk.mu.Unlock()
	if len(chk.violations) > 0 {
		t.Errorf("%d commits passed records without rows, e.g. %s", len(chk.violations), chk.violations[0])
	}
	if chk.checked == 0 {
		t.Error("no commit seen")
	}
	t.Logf("%d partition commits checked against the table", chk.checked)
}

// postgresEnv names a PostgreSQL DSN to run TestSinkRebalance against as
// well (its table is shared by the tests: each counts its own topic's
// rows).
const postgresEnv = "SAFEACK_SINK_POSTGRES"

// rig is a broker with a topic of records, and the sink's table.
type rig struct {
	c            *kafkatest.Cluster
	topic, group string
	db           string
	postgres     string
	st           *store // the test's own connection
	records      int64
	chk          *commitCheck
}

func newRig(t *testing.T, partitions, records int, postgres string) *rig {
	c := kafkatest.Start(t, kafkatest.Embedded())
	r := &rig{c: c, topic: c.NewTopic(t, partitions), group: c.NewGroup(t), db: filepath.Join(t.TempDir(), "sink.db"), postgres: postgres, records: int64(records)}
	var err error
	if r.st, err = openStore(context.Background(), r.db, postgres); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.st.Close() })
	r.chk = checkCommits(t, c, r.st, r.group, r.topic)
	c.ProduceN(t, r.topic, partitions, records, nil)
	return r
}

func (r *rig) rows(t *testing.T) int64 {
	n, err := r.st.count(context.Background(), r.topic)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// writeLockProbe returns a function reporting whether another connection
// holds the table's write lock (an open write transaction): it tries to
// take the lock without waiting, and gives it back at once.
func (r *rig) writeLockProbe(t *testing.T) func() bool {
	db, err := sql.Open("sqlite", "file:"+r.db+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return func() bool {
		conn, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
			return strings.Contains(err.Error(), "SQLITE_BUSY") || strings.Contains(err.Error(), "locked")
		}
		_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		return false
	}
}

func (r *rig) args(extra ...string) []string {
	args := []string{"-brokers", strings.Join(r.c.Brokers(), ","), "-topic", r.topic, "-group", r.group, "-db", r.db,
		"-session-timeout", "2s", "-stats-every", "0"}
	if r.postgres != "" {
		args = append(args, "-postgres", r.postgres)
	}
	return append(args, extra...)
}

// finish waits for a row per record and for the group to commit every
// partition to its end, then checks the rows and the commits.
func (r *rig) finish(t *testing.T) {
	t.Helper()
	kafkatest.WaitFor(t, wait, "a row for every record", func() bool { return r.rows(t) >= r.records })
	hwm := r.c.HighWaterMarks(t, r.topic)
	kafkatest.WaitFor(t, wait, "commits at every partition's end", func() bool {
		co := r.c.CommittedOffsets(t, r.group, r.topic)
		for p, end := range hwm {
			if co[p].Offset != end {
				return false
			}
		}
		return true
	})
}

// process is the sink running as a process of its own.
type process struct {
	cmd    *exec.Cmd
	out    safeacktest.Buffer
	exited chan error
}

func startSink(t *testing.T, args []string) *process {
	p := &process{cmd: exec.Command(os.Args[0]), exited: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), runMain+"=1", argsEnv+"="+strings.Join(args, " "))
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// stop sends sig and waits for the process to exit; it returns its error.
func (p *process) stop(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		return err
	case <-time.After(wait):
		t.Fatalf("the sink did not exit within %v of %v; its output:\n%s", wait, sig, p.out.String())
		return nil
	}
}

var closedLine = regexp.MustCompile(`closed: (\d+) rows in the table, (\d+) inserted here from (\d+) messages`)

// TestSinkKilledMidBatch: a sink SIGKILLed while its transactions are
// open (each held 100 ms), and a second one started on the same table:
// at the end there is one row per record, every commit the broker
// received had the rows of every record below it, and the second sink's
// close commits every partition's end.
func TestSinkKilledMidBatch(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, 2000, "")
	first := startSink(t, r.args("-batch-size", "100", "-write-delay", "100ms"))
	kafkatest.WaitFor(t, wait, "the first sink to write 800 rows and commit", func() bool {
		return r.rows(t) >= 800 && r.chk.count() > 0
	})
	// Kill it while it holds a transaction open: when the table's write
	// lock is taken (a batch's rows are inserted, not yet committed).
	probe := r.writeLockProbe(t)
	kafkatest.WaitFor(t, wait, "the first sink inside a transaction", probe)
	if err := first.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("the killed sink exited cleanly")
	}
	atKill := r.rows(t)
	t.Logf("killed inside a transaction, with %d rows written", atKill)

	second := startSink(t, r.args("-batch-size", "100"))
	r.finish(t)
	if err := second.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("the second sink ended with %v; its output:\n%s", err, second.out.String())
	}
	if n := r.rows(t); n != r.records {
		t.Errorf("%d rows for %d records", n, r.records)
	}
	m := closedLine.FindStringSubmatch(second.out.String())
	if m == nil {
		t.Fatalf("no closing line in the second sink's output:\n%s", second.out.String())
	}
	inserted, _ := strconv.ParseInt(m[2], 10, 64)
	handled, _ := strconv.ParseInt(m[3], 10, 64)
	if inserted != r.records-atKill {
		t.Errorf("the second sink inserted %d rows, want %d (the records the first left without a row)", inserted, r.records-atKill)
	}
	t.Logf("the second sink handled %d messages and inserted %d rows: %d records written by the first came again", handled, inserted, handled-inserted)
	r.chk.assert(t)
}

// TestSinkRebalance: two sinks in one process on the same table, the
// second joining while the first writes and the first closing while the
// second writes: one row per record, and no commit ahead of the rows. On
// SQLite, and on PostgreSQL when SAFEACK_SINK_POSTGRES gives a DSN.
func TestSinkRebalance(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testSinkRebalance(t, "")
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := os.Getenv(postgresEnv)
		if dsn == "" {
			t.Skip(postgresEnv + " not set")
		}
		t.Parallel()
		testSinkRebalance(t, dsn)
	})
}

func testSinkRebalance(t *testing.T, postgres string) {
	r := newRig(t, 4, 2000, postgres)
	start := func(extra ...string) (cancel func() error) {
		cfg, err := parseFlags(r.args(extra...), func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		var out safeacktest.Buffer
		done := make(chan error, 1)
		go func() { done <- run(ctx, cfg, &out) }()
		stopped := false
		cancel = func() error {
			if stopped {
				return nil
			}
			stopped = true
			stop()
			select {
			case err := <-done:
				return err
			case <-time.After(wait):
				t.Fatalf("the sink did not return within %v; its output:\n%s", wait, out.String())
				return nil
			}
		}
		t.Cleanup(func() { _ = cancel() })
		return cancel
	}
	stopA := start("-batch-size", "50", "-write-delay", "20ms")
	kafkatest.WaitFor(t, wait, "sink A to write 300 rows", func() bool { return r.rows(t) >= 300 })
	stopB := start("-batch-size", "50", "-write-delay", "20ms")
	kafkatest.WaitFor(t, wait, "1,000 rows", func() bool { return r.rows(t) >= 1000 })
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	r.finish(t)
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if n := r.rows(t); n != r.records {
		t.Errorf("%d rows for %d records", n, r.records)
	}
	r.chk.assert(t)
}
