// Package kafkatest is the test broker harness: it starts an in-process
// Kafka-protocol broker (kfake) on loopback, or uses a real cluster named by
// SAFEACK_KAFKA_BROKERS (secured, with TLS and a SASL login, when the
// variables of security.go say so: SaramaConfig and KgoOpts connect the
// way they say, and NewUser and Allow make least-privilege users), and
// gives tests unique topics and groups, synchronous
// produce with known offsets, committed offsets and high watermarks read back
// from the broker, and (embedded only) a log of every OffsetCommit request the
// broker receives.
//
// Every helper that takes a testing.TB fails the test through it, so call them
// from the test goroutine (t.Fatal must not run on other goroutines).
package kafkatest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// EnvBrokers names the environment variable that points the harness at a real
// cluster: comma-separated host:port bootstrap addresses. When it is set, no
// embedded broker is started.
const EnvBrokers = "SAFEACK_KAFKA_BROKERS"

// EnvVersion names the environment variable that overrides the Kafka version
// Sarama assumes (for example "3.9.2"), for real clusters older than
// DefaultVersion. Sarama negotiates request versions through ApiVersions
// anyway, so this is rarely needed. scripts/kafka.sh and
// scripts/kafka-cluster.sh read the same variable as the version of the
// broker to start, so one export runs the tests as a client of that version
// (what .ci/run does for each version it tests).
const EnvVersion = "SAFEACK_KAFKA_VERSION"

// DefaultVersion is the Kafka version SaramaConfig declares. Sarama clamps
// every request to what the broker advertises in ApiVersions, and kfake
// advertises recent versions, so a recent version works against both kfake
// and real brokers.
var DefaultVersion = sarama.V4_1_0_0

// Session timeouts. kfake's default minimum group session timeout is 6s (as
// is real Kafka's group.min.session.timeout.ms); a shorter client timeout is
// rejected with INVALID_SESSION_TIMEOUT, so the embedded broker lowers its
// minimum and real clusters get a 6s client timeout.
const (
	// EmbeddedMinSessionTimeout is the embedded broker's minimum group
	// session timeout: low, so tests may shorten the client side further.
	EmbeddedMinSessionTimeout = 500 * time.Millisecond
	// EmbeddedSessionTimeout is SaramaConfig's session timeout on the
	// embedded broker: a killed member is evicted within about this long.
	EmbeddedSessionTimeout = 3 * time.Second
	// EmbeddedConsumerHeartbeat is the embedded broker's heartbeat
	// interval for consumer-protocol groups (KIP-848).
	EmbeddedConsumerHeartbeat = 250 * time.Millisecond
	// RealSessionTimeout is SaramaConfig's session timeout on a real cluster,
	// the smallest a default-configured broker accepts.
	RealSessionTimeout = 6 * time.Second
)

// Option configures Start.
type Option func(*options)

type options struct {
	brokers   int
	kfakeOpts []kfake.Opt
	superuser *sasl
	embedded  bool
}

type sasl struct{ user, pass string }

// WithBrokers sets how many embedded brokers to start (default 1). It has no
// effect on a real cluster.
func WithBrokers(n int) Option {
	return func(o *options) { o.brokers = n }
}

// WithKfakeOpts passes extra options to kfake.NewCluster. They are applied
// after the harness defaults, so they override them (for example a different
// kfake.GroupMinSessionTimeout). They have no effect on a real cluster.
func WithKfakeOpts(opts ...kfake.Opt) Option {
	return func(o *options) { o.kfakeOpts = append(o.kfakeOpts, opts...) }
}

// WithPlainSuperuser makes the embedded broker require SASL/PLAIN logins,
// with user as a superuser (ACL checks do not apply to it), and
// SaramaConfig log in as that user. Add kfake.EnableACLs and kfake.User
// (WithKfakeOpts) for users whose ACLs are checked. A test using it needs
// the embedded broker: Start skips it on a real cluster.
func WithPlainSuperuser(user, pass string) Option {
	return func(o *options) { o.superuser = &sasl{user: user, pass: pass} }
}

// Embedded makes Start skip the test on a real cluster, as RequireEmbedded
// does, before anything is created: fault injection and commit observation
// exist only on the embedded broker.
func Embedded() Option {
	return func(o *options) { o.embedded = true }
}

// Cluster is a Kafka cluster for one test (and its subtests): embedded kfake
// or a real cluster. Its methods are safe for concurrent use.
type Cluster struct {
	brokers   []string
	kf        *kfake.Cluster // nil on a real cluster
	version   sarama.KafkaVersion
	superuser *sasl     // SaramaConfig's login; nil: none
	sec       *Security // a secured real cluster's TLS and login; nil: plaintext

	seq atomic.Uint64 // makes produced values unique across the Cluster

	mu       sync.Mutex
	client   sarama.Client // shared by admin and producer, made lazily
	admin    sarama.ClusterAdmin
	producer sarama.SyncProducer
	produced map[string][]Produced

	observers commitObservers // embedded only: see ObserveCommits
}

// Start returns a cluster for tb, closed through tb.Cleanup. Without
// SAFEACK_KAFKA_BROKERS it starts kfake on loopback (one broker by default,
// minimum session timeout EmbeddedMinSessionTimeout so tests that kill members
// are fast); with it, it uses that real cluster and starts nothing.
func Start(tb testing.TB, opts ...Option) *Cluster {
	tb.Helper()
	o := options{brokers: 1}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Cluster{version: DefaultVersion, produced: make(map[string][]Produced)}
	if v := strings.TrimSpace(os.Getenv(EnvVersion)); v != "" {
		ver, err := sarama.ParseKafkaVersion(v)
		if err != nil {
			tb.Fatalf("kafkatest: %s=%q: %v", EnvVersion, v, err)
		}
		c.version = ver
	}

	if env := strings.TrimSpace(os.Getenv(EnvBrokers)); env != "" {
		if o.embedded {
			tb.Skipf(needsEmbedded, EnvBrokers)
		}
		if o.superuser != nil {
			tb.Skipf("kafkatest: needs the embedded kfake broker (SASL users and ACLs); %s points at a real cluster", EnvBrokers)
		}
		for _, b := range strings.Split(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				c.brokers = append(c.brokers, b)
			}
		}
		if len(c.brokers) == 0 {
			tb.Fatalf("kafkatest: %s=%q names no broker", EnvBrokers, env)
		}
		sec, ok, err := securityFromEnv()
		if err != nil {
			tb.Fatalf("kafkatest: %v", err)
		}
		if ok {
			c.sec = &sec
		}
		tb.Cleanup(c.closeClients)
		return c
	}

	kopts := []kfake.Opt{
		kfake.NumBrokers(o.brokers),
		kfake.GroupMinSessionTimeout(EmbeddedMinSessionTimeout),
		// Consumer-protocol (KIP-848) groups: the coordinator sets their
		// heartbeat and session timeout. A member reconciles an
		// assignment on its heartbeat, so a short one keeps rebalances
		// quick; the session is EmbeddedSessionTimeout, as the classic
		// groups' (see SaramaConfig).
		kfake.BrokerConfigs(map[string]string{
			"group.consumer.heartbeat.interval.ms": strconv.Itoa(int(EmbeddedConsumerHeartbeat.Milliseconds())),
			"group.consumer.session.timeout.ms":    strconv.Itoa(int(EmbeddedSessionTimeout.Milliseconds())),
		}),
	}
	if o.superuser != nil {
		kopts = append(kopts, kfake.EnableSASL(), kfake.Superuser("PLAIN", o.superuser.user, o.superuser.pass))
		c.superuser = o.superuser
	}
	kopts = append(kopts, o.kfakeOpts...)
	kf, err := kfake.NewCluster(kopts...)
	if err != nil {
		tb.Fatalf("kafkatest: starting kfake: %v", err)
	}
	c.kf = kf
	c.brokers = kf.ListenAddrs()
	// Installed first, so that no other control function is before it in
	// kfake's list (see commitObservers).
	c.observers.logs = make(map[*CommitLog]struct{})
	c.observeCommits()
	// One cleanup, clients first: a client still connected while the
	// broker closes spends its time retrying and logging.
	tb.Cleanup(func() {
		c.closeClients()
		kf.Close()
	})
	return c
}

// KillableSessions sets sc's group session, heartbeat and rebalance
// timeouts for a member a test kills on the embedded broker: it is evicted
// quickly, but not so fast that a loaded machine expels a live member.
func KillableSessions(sc *sarama.Config) {
	sc.Consumer.Group.Session.Timeout = EmbeddedSessionTimeout
	sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	sc.Consumer.Group.Rebalance.Timeout = EmbeddedSessionTimeout
}

// StartTopic is the preamble of most end-to-end tests: Start, then a new
// topic of the given partitions and a group name unique to tb.
func StartTopic(tb testing.TB, partitions int, opts ...Option) (c *Cluster, topic, group string) {
	tb.Helper()
	c = Start(tb, opts...)
	return c, c.NewTopic(tb, partitions), c.NewGroup(tb)
}

// Brokers returns the bootstrap addresses.
func (c *Cluster) Brokers() []string { return append([]string(nil), c.brokers...) }

// Embedded reports whether the cluster is the in-process kfake broker.
func (c *Cluster) Embedded() bool { return c.kf != nil }

// Kfake returns the embedded broker for fault injection and inspection, or
// nil on a real cluster (see RequireEmbedded).
func (c *Cluster) Kfake() *kfake.Cluster { return c.kf }

const needsEmbedded = "kafkatest: needs the embedded kfake broker (fault injection / broker-side observation); %s points at a real cluster"

// RequireEmbedded skips the test on a real cluster: fault injection and
// commit observation exist only on the embedded broker.
func (c *Cluster) RequireEmbedded(tb testing.TB) {
	tb.Helper()
	if c.kf == nil {
		tb.Skipf(needsEmbedded, EnvBrokers)
	}
}

// SaramaConfig returns a fresh config suited to tests: DefaultVersion (or
// SAFEACK_KAFKA_VERSION), synchronous-producer ready (successes returned,
// manual partitioner, acks from all replicas), a short group session
// (EmbeddedSessionTimeout, or RealSessionTimeout on a real cluster) with the
// heartbeat at a third of it, OffsetOldest for groups without commits, and
// short backoffs and refreshes so recovery takes milliseconds, not seconds;
// on a secured cluster, TLS and the SASL login of the Env* variables
// (security.go). Callers may change it freely.
func (c *Cluster) SaramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = c.version
	cfg.ClientID = "safeack-kafkatest"

	cfg.Net.DialTimeout = 5 * time.Second

	cfg.Metadata.RefreshFrequency = time.Second
	cfg.Metadata.Retry.Max = 20
	cfg.Metadata.Retry.Backoff = 50 * time.Millisecond

	cfg.Admin.Timeout = 10 * time.Second
	cfg.Admin.Retry.Max = 20
	cfg.Admin.Retry.Backoff = 50 * time.Millisecond

	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Retry.Max = 10
	cfg.Producer.Retry.Backoff = 50 * time.Millisecond

	session := EmbeddedSessionTimeout
	if c.kf == nil {
		session = RealSessionTimeout
	}
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Consumer.Offsets.Retry.Max = 10
	cfg.Consumer.Group.Session.Timeout = session
	cfg.Consumer.Group.Heartbeat.Interval = session / 3
	// Long enough for a member to finish its ConsumeClaims, short enough
	// that a member that never rejoins does not stall a test for a minute.
	cfg.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	cfg.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	cfg.Consumer.Retry.Backoff = 100 * time.Millisecond
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	if c.superuser != nil {
		cfg.Net.SASL.Enable = true
		cfg.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		cfg.Net.SASL.User, cfg.Net.SASL.Password = c.superuser.user, c.superuser.pass
	}
	if c.sec != nil {
		if err := c.sec.ApplySarama(cfg); err != nil {
			panic(err) // checked by Start
		}
	}
	return cfg
}

// Admin returns the harness's shared ClusterAdmin, for operations it does not
// wrap. Do not close it; the harness does at cleanup.
func (c *Cluster) Admin(tb testing.TB) sarama.ClusterAdmin {
	tb.Helper()
	_, admin := c.clients(tb)
	return admin
}

// clients makes the shared client and admin on first use: tests that only
// need the broker address never pay for them.
func (c *Cluster) clients(tb testing.TB) (sarama.Client, sarama.ClusterAdmin) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		client, err := sarama.NewClient(c.brokers, c.SaramaConfig())
		if err != nil {
			tb.Fatalf("kafkatest: sarama client for %v: %v", c.brokers, err)
		}
		admin, err := sarama.NewClusterAdminFromClient(client)
		if err != nil {
			_ = client.Close()
			tb.Fatalf("kafkatest: sarama admin: %v", err)
		}
		c.client, c.admin = client, admin
	}
	return c.client, c.admin
}

// syncProducer makes the shared producer on first use.
func (c *Cluster) syncProducer(tb testing.TB) sarama.SyncProducer {
	tb.Helper()
	client, _ := c.clients(tb)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.producer == nil {
		p, err := sarama.NewSyncProducerFromClient(client)
		if err != nil {
			tb.Fatalf("kafkatest: sarama producer: %v", err)
		}
		c.producer = p
	}
	return c.producer
}

func (c *Cluster) closeClients() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.producer != nil {
		_ = c.producer.Close()
		c.producer = nil
	}
	if c.client != nil {
		// The admin was made from the client; closing the client is
		// closing the admin.
		_ = c.client.Close()
		c.client, c.admin = nil, nil
	}
}

// NewTopic creates a topic with the given number of partitions, named after
// the test plus a random suffix so runs against a shared real cluster never
// collide, and waits until metadata shows every partition with a leader that
// answers for it (a ListOffsets succeeds).
func (c *Cluster) NewTopic(tb testing.TB, partitions int) string {
	tb.Helper()
	return c.NewTopicWithConfig(tb, partitions, nil)
}

// NewTopicWithConfig is NewTopic with topic configs (e.g.
// "max.message.bytes"); nil takes the broker's defaults.
func (c *Cluster) NewTopicWithConfig(tb testing.TB, partitions int, configs map[string]string) string {
	tb.Helper()
	if partitions < 1 {
		tb.Fatalf("kafkatest: NewTopic: %d partitions", partitions)
	}
	client, admin := c.clients(tb)
	name := uniqueName("t-", tb.Name())
	// ReplicationFactor -1 takes the broker default: 1 on kfake, whatever the
	// real cluster is set up for.
	detail := &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: -1}
	for k, v := range configs {
		if detail.ConfigEntries == nil {
			detail.ConfigEntries = make(map[string]*string, len(configs))
		}
		detail.ConfigEntries[k] = &v
	}
	if err := admin.CreateTopic(name, detail, false); err != nil {
		tb.Fatalf("kafkatest: creating topic %s: %v", name, err)
	}
	// A leader in Metadata is not enough: a KRaft broker publishes the new
	// partition in its metadata before its replica manager has made the
	// log, and answers ListOffsets or Fetch in between with
	// NOT_LEADER_OR_FOLLOWER, which Sarama's ConsumePartition does not
	// wait out. Each partition's leader must answer a ListOffsets.
	WaitFor(tb, 15*time.Second, fmt.Sprintf("topic %s to have %d partitions served by their leaders", name, partitions), func() bool {
		if err := client.RefreshMetadata(name); err != nil {
			return false
		}
		ps, err := client.Partitions(name)
		if err != nil || len(ps) != partitions {
			return false
		}
		for _, p := range ps {
			if !partitionServed(client, name, p) {
				return false
			}
		}
		return true
	})
	return name
}

// partitionServed reports whether the leader Metadata names for
// topic/partition answers a ListOffsets for it without error.
func partitionServed(client sarama.Client, topic string, partition int32) bool {
	leader, err := client.Leader(topic, partition)
	if err != nil {
		return false
	}
	req := &sarama.OffsetRequest{Version: 1}
	req.AddBlock(topic, partition, sarama.OffsetNewest, 1)
	resp, err := leader.GetAvailableOffsets(req)
	if err != nil {
		return false
	}
	block := resp.GetBlock(topic, partition)
	return block != nil && block.Err == sarama.ErrNoError
}

// NewGroup returns a consumer group name unique to this test and run. Nothing
// is created: Kafka creates groups on first join.
func (c *Cluster) NewGroup(tb testing.TB) string {
	tb.Helper()
	return uniqueName("g-", tb.Name())
}

var nameSeq atomic.Uint64

// uniqueName builds prefix + sanitized test name + counter + random suffix.
// The counter keeps names unique in-process, the random part across runs.
func uniqueName(prefix, testName string) string {
	var b strings.Builder
	for _, r := range testName {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	base := b.String()
	// Kafka allows 249 characters; topic names also end up in file names on
	// real brokers, so stay well below.
	if len(base) > 100 {
		base = base[:100]
	}
	return fmt.Sprintf("%s%s-%d-%08x", prefix, base, nameSeq.Add(1), rand.Uint32())
}

// WaitFor polls cond every 10ms until it returns true, and fails the test
// with what if timeout passes first. cond always gets one look after the
// deadline, so a slow poll never fails a condition that holds.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Poll(timeout, 10*time.Millisecond, cond) {
		tb.Fatalf("kafkatest: timed out after %v waiting for %s", timeout, what)
	}
}

// Poll calls cond every interval until it holds or timeout passes, and
// reports whether it held. The clock is read before each call, so cond gets
// one last look after the deadline.
func Poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		expired := time.Now().After(deadline)
		if cond() {
			return true
		}
		if expired {
			return false
		}
		time.Sleep(interval)
	}
}

// RebalanceName names a rebalance protocol in subtest names: "eager" or
// "cooperative".
func RebalanceName(cooperative bool) string {
	if cooperative {
		return "cooperative"
	}
	return "eager"
}

// EagerAndCooperative runs f in two parallel subtests of t, named by
// RebalanceName: eager first, then cooperative.
func EagerAndCooperative(t *testing.T, f func(t *testing.T, cooperative bool)) {
	t.Helper()
	for _, cooperative := range []bool{false, true} {
		t.Run(RebalanceName(cooperative), func(t *testing.T) {
			t.Parallel()
			f(t, cooperative)
		})
	}
}
