package safeack_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Tests on a secured cluster: a SASL_SSL listener with SCRAM logins, the
// standard authorizer, nothing allowed without an ACL (scripts/kafka.sh
// start with SAFEACK_KAFKA_SECURITY=sasl_ssl, whose output sets the
// harness's variables; see internal/kafkatest/security.go). Each mode runs
// as a user holding only the ACLs docs/operations.md lists for it; logins
// that cannot succeed fail Subscribe within seconds, saying why; no
// password reaches the logs. They skip themselves on any other cluster.

// startSecured returns the secured cluster, or skips the test.
func startSecured(t *testing.T) *kafkatest.Cluster {
	t.Helper()
	c := kafkatest.Start(t)
	c.RequireSecured(t)
	return c
}

// asUser makes a Sarama config log in as user (same TLS, same mechanism).
func asUser(t *testing.T, c *kafkatest.Cluster, cfg *sarama.Config, user, password string) {
	t.Helper()
	require.NoError(t, c.Security().As(user, password).ApplySarama(cfg))
}

// requireNoSecret fails if any captured log line (message, error or
// field) holds one of secrets; it returns how many lines it read.
func requireNoSecret(t *testing.T, logs *watermill.CaptureLoggerAdapter, secrets ...string) int {
	t.Helper()
	n := 0
	for level, lines := range logs.Captured() {
		for _, l := range lines {
			n++
			text := fmt.Sprintf("%s %v %v", l.Msg, l.Err, l.Fields)
			for _, s := range secrets {
				if s != "" && strings.Contains(text, s) {
					t.Errorf("a password in a log line (level %v): %s", level, text)
				}
			}
		}
	}
	return n
}

// readerOf makes a user holding only READ on topic and on group (on topic
// alone when group is empty), and returns its login.
func readerOf(t *testing.T, c *kafkatest.Cluster, topic, group string) (user, password string) {
	t.Helper()
	user, password = c.NewUser(t)
	acls := []kafkatest.ACL{{Type: sarama.AclResourceTopic, Name: topic, Op: sarama.AclOperationRead}}
	if group != "" {
		acls = append(acls, kafkatest.ACL{Type: sarama.AclResourceGroup, Name: group, Op: sarama.AclOperationRead})
	}
	c.Allow(t, user, acls...)
	return user, password
}

// At-least-once, as a user holding only READ on the topic and on the group
// (no group: READ on the topic alone): every record is handed out and,
// with a group, the group's commits reach the end.
func TestSecuredAtLeastOnceLeastPrivilege(t *testing.T) {
	t.Parallel()
	c := startSecured(t)
	for _, noGroup := range []bool{false, true} {
		name := "group"
		if noGroup {
			name = "no group"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testSecuredAtLeastOnce(t, c, noGroup)
		})
	}
}

func testSecuredAtLeastOnce(t *testing.T, c *kafkatest.Cluster, noGroup bool) {
	topic, group := c.NewTopic(t, 2), c.NewGroup(t)
	if noGroup {
		group = ""
	}
	user, password := readerOf(t, c, topic, group)
	const n = 100
	c.ProduceN(t, topic, 2, n, nil)

	logs := watermill.NewCaptureLogger()
	sub := newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) {
		asUser(t, c, cfg.OverwriteSaramaConfig, user, password)
	})
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	require.NoError(t, sub.WaitReady(wctx))
	t.Logf("ready %v after Subscribe", time.Since(start).Round(time.Millisecond))
	for range n {
		select {
		case m := <-msgs:
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatal("not every record was handed out")
		}
	}
	if !noGroup {
		hwm := c.HighWaterMarks(t, topic)
		kafkatest.WaitFor(t, 20*time.Second, "the group's commits to reach the end", func() bool {
			got := c.CommittedOffsets(t, group, topic)
			for p, h := range hwm {
				if got[p].Offset != h {
					return false
				}
			}
			return true
		})
	}
	cancel()
	require.NoError(t, sub.Close())
	lines := requireNoSecret(t, logs, password, c.Security().Password)
	t.Logf("%d records in %v; %d log lines, no password in them", n, time.Since(start).Round(time.Millisecond), lines)
}

// txnACLs are the ACLs of a transactional subscriber's user: READ on the
// input topic and the group, WRITE on the output topic, and WRITE on the
// transactional ids that start with txnID (the producer of a subscription
// is named txnID-<input topic>).
func txnACLs(r *txnRig, txnID string) []kafkatest.ACL {
	return []kafkatest.ACL{
		{Type: sarama.AclResourceTopic, Name: r.in, Op: sarama.AclOperationRead},
		{Type: sarama.AclResourceGroup, Name: r.group, Op: sarama.AclOperationRead},
		{Type: sarama.AclResourceTopic, Name: r.out, Op: sarama.AclOperationWrite},
		{Type: sarama.AclResourceTransactionalID, Name: txnID, Prefixed: true, Op: sarama.AclOperationWrite},
	}
}

// securedTxn makes a txnRig on the secured cluster and a transactional
// subscriber whose consumer and producer log in as a user holding only
// txnACLs, logging to logs; mod, if not nil, changes the configs first.
func securedTxn(t *testing.T, partitions, records int, mod func(*safeack.SubscriberConfig, *safeack.TxnConfig)) (r *txnRig, sub *safeack.Subscriber, pub *safeack.TxnPublisher, logs *watermill.CaptureLoggerAdapter, password string) {
	t.Helper()
	c := startSecured(t)
	r = newTxnRig(t, c, partitions, records)
	txnID := "txn-sec-" + r.group
	user, password := c.NewUser(t)
	c.Allow(t, user, txnACLs(r, txnID)...)
	logs = watermill.NewCaptureLogger()
	sub, pub = r.loggedSubscriber(t, txnID, logs, func(cfg *safeack.SubscriberConfig, tc *safeack.TxnConfig) {
		if mod != nil {
			mod(cfg, tc)
		}
		asUser(t, c, cfg.OverwriteSaramaConfig, user, password)
		asUser(t, c, tc.OverwriteSaramaConfig, user, password)
	})
	return r, sub, pub, logs, password
}

// Exactly-once, as a user holding only txnACLs: every input has exactly
// one committed output and the group's commits reach the end.
func TestSecuredTxnLeastPrivilege(t *testing.T) {
	t.Parallel()
	r, sub, pub, logs, password := securedTxn(t, 2, 200, nil)
	c := r.c
	start := time.Now()
	var att attempts
	stop := runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{outputOf(msg, att.next(msg))}, nil
	})
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	r.requireExactlyOnce(t, rd, r.inputIDs(), 60*time.Second, 30*time.Second)
	st := pub.Stats()
	stop()
	lines := requireNoSecret(t, logs, password, c.Security().Password)
	t.Logf("%d inputs in %v (transactions: %+v); %d log lines, no password in them",
		len(r.inputs), time.Since(start).Round(time.Millisecond), st, lines)
}

// shareReader returns the secured cluster (skipping the test unless it
// serves share groups), a topic of the given partitions, a share group and
// a user holding only READ on both.
func shareReader(t *testing.T, partitions int) (c *kafkatest.Cluster, topic, group, user, password string) {
	t.Helper()
	c = startSecured(t)
	requireShareGroups(t, c)
	topic, group = c.NewTopic(t, partitions), c.NewGroup(t)
	user, password = readerOf(t, c, topic, group)
	return c, topic, group, user, password
}

// Share groups, as a user holding only READ on the topic and on the share
// group (the group's share.auto.offset.reset is the admin's to set:
// InitialOffset would need ALTER_CONFIGS on the group, so it is left zero).
func TestSecuredShareLeastPrivilege(t *testing.T) {
	t.Parallel()
	c, topic, group, user, password := shareReader(t, 2)
	setShareGroupConfigs(t, c, group, map[string]string{"share.auto.offset.reset": "earliest"})
	const n = 50
	c.ProduceN(t, topic, 2, n, nil)

	logs := watermill.NewCaptureLogger()
	start := time.Now()
	sub := newShareSubLogged(t, c, group, logs, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.ClientOptions = c.KgoOptsAs(user, password)
		cfg.InitialOffset = 0
	})
	msgs := subscribeShare(t, sub, topic)
	t.Logf("ready %v after Subscribe", time.Since(start).Round(time.Millisecond))
	seen := answerAll(msgs, (*message.Message).Ack)
	kafkatest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d records", n), func() bool { return seen.distinct() == n })
	require.NoError(t, sub.Close())
	total, _ := shareTotals(sub)
	assert.EqualValues(t, n, total.Accepted, "%+v", total)
	lines := requireNoSecret(t, logs, password, c.Security().Password)
	t.Logf("%d records in %v; %d log lines, no password in them", n, time.Since(start).Round(time.Millisecond), lines)
}

// A share subscriber with InitialOffset set writes the group's
// share.auto.offset.reset (IncrementalAlterConfigs on the group), which
// needs ALTER_CONFIGS on the group: a user holding only READ is refused
// at Subscribe, within seconds, with an error naming the authorization.
func TestSecuredShareInitialOffsetNeedsAlterConfigs(t *testing.T) {
	t.Parallel()
	c, topic, group, user, password := shareReader(t, 1)
	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
		Brokers: c.Brokers(), ShareGroup: group, ClientOptions: c.KgoOptsAs(user, password),
		InitialOffset: sarama.OffsetOldest, DrainTimeout: 200 * time.Millisecond,
	}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*maxRefusal)
	defer cancel()
	start := time.Now()
	_, err = sub.Subscribe(ctx, topic)
	took := time.Since(start)
	t.Logf("Subscribe returned after %v: %v", took.Round(time.Millisecond), err)
	require.Error(t, err)
	assert.Less(t, took, maxRefusal)
	assert.Contains(t, strings.ToUpper(err.Error()), "AUTHORIZATION")
}

// SubscribeInitialize of a ShareSubscriber connects as ClientOptions say:
// on a secured cluster, it creates the topic (for a user allowed to).
func TestSecuredShareSubscribeInitialize(t *testing.T) {
	t.Parallel()
	c := startSecured(t)
	requireShareGroups(t, c)
	topic := "t-share-init-" + c.NewGroup(t)
	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
		Brokers: c.Brokers(), ShareGroup: c.NewGroup(t), ClientOptions: c.KgoOpts(),
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: 2, ReplicationFactor: 1},
	}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	start := time.Now()
	err = sub.SubscribeInitialize(topic)
	t.Logf("SubscribeInitialize returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	require.NoError(t, err)
}

// untrustedCA writes a CA certificate that signed nothing the cluster
// serves, and returns its file.
func untrustedCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "untrusted test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "untrusted-ca.pem")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return path
}

// refusedLogin is a way to connect that the cluster refuses: the
// security settings and what the error must say.
type refusedLogin struct {
	name  string
	sec   kafkatest.Security
	cause []string // one of them, lower case, in the error
}

func refusedLogins(t *testing.T, c *kafkatest.Cluster, user, password string) []refusedLogin {
	good := c.Security().As(user, password)
	wrongPassword := good
	wrongPassword.Password = "wrong-" + password[:8]
	untrusted := good
	untrusted.CAFile = untrustedCA(t)
	wrongName := good
	wrongName.ServerName = "wrong.invalid"
	return []refusedLogin{
		{"wrong password", wrongPassword, []string{"authentication failed", "invalid credentials"}},
		{"untrusted CA", untrusted, []string{"unknown authority"}},
		{"wrong server name", wrongName, []string{"wrong.invalid"}},
	}
}

// maxRefusal is how long a refused login may take to fail Subscribe.
const maxRefusal = 10 * time.Second

// A wrong password, an untrusted CA and a wrong server name fail Subscribe
// (or WaitReady) within seconds, in every mode, with an error naming the
// cause; the password tried appears in no log line.
func TestSecuredRefusedLogins(t *testing.T) {
	t.Parallel()
	c := startSecured(t)
	requireShareGroups(t, c)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	user, password := c.NewUser(t)
	c.Allow(t, user,
		kafkatest.ACL{Type: sarama.AclResourceTopic, Name: topic, Op: sarama.AclOperationAll},
		kafkatest.ACL{Type: sarama.AclResourceGroup, Name: group, Op: sarama.AclOperationAll},
		kafkatest.ACL{Type: sarama.AclResourceTransactionalID, Name: "txn-refused", Prefixed: true, Op: sarama.AclOperationAll},
	)
	for _, rl := range refusedLogins(t, c, user, password) {
		for _, mode := range []string{"at-least-once", "exactly-once", "share"} {
			t.Run(rl.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				logs := watermill.NewCaptureLogger()
				took, err := subscribeRefused(t, c, rl.sec, mode, topic, group, logs)
				t.Logf("%s: failed after %v: %v", mode, took.Round(time.Millisecond), err)
				require.Error(t, err)
				assert.Less(t, took, maxRefusal)
				msg := strings.ToLower(err.Error())
				named := false
				for _, cause := range rl.cause {
					named = named || strings.Contains(msg, cause)
				}
				assert.True(t, named, "the error does not name the cause (%q): %v", rl.cause, err)
				requireNoSecret(t, logs, rl.sec.Password, password, c.Security().Password)
			})
		}
	}
}

// subscribeRefused subscribes in mode as sec says and returns how long
// until Subscribe or WaitReady failed, and the error (nil if it did not
// fail within 2 x maxRefusal).
func subscribeRefused(t *testing.T, c *kafkatest.Cluster, sec kafkatest.Security, mode, topic, group string, logs watermill.LoggerAdapter) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	var waitReady func(context.Context) error
	var err error
	switch mode {
	case "share":
		opts, oerr := sec.KgoOpts()
		require.NoError(t, oerr)
		sub, nerr := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
			Brokers: c.Brokers(), ShareGroup: group, ClientOptions: opts, DrainTimeout: 200 * time.Millisecond,
		}, logs)
		require.NoError(t, nerr)
		defer sub.Close()
		start = time.Now()
		_, err = sub.Subscribe(ctx, topic)
		waitReady = sub.WaitReady
	default:
		// Sarama's metadata retries as a user has them (3, 250 ms
		// apart), not the harness's 20: they bound the time to fail.
		userRetries := sarama.NewConfig().Metadata.Retry
		cfg := testSubscriberConfig(c, group, nil)
		cfg.OverwriteSaramaConfig.Metadata.Retry = userRetries
		require.NoError(t, sec.ApplySarama(cfg.OverwriteSaramaConfig))
		var sub *safeack.Subscriber
		if mode == "exactly-once" {
			pcfg := txnProducerConfig(c)
			pcfg.Metadata.Retry = userRetries
			require.NoError(t, sec.ApplySarama(pcfg))
			sub, _, err = safeack.NewTxnSubscriber(cfg, safeack.TxnConfig{TransactionalID: "txn-refused", OverwriteSaramaConfig: pcfg}, logs)
		} else {
			sub, err = safeack.NewSubscriber(cfg, logs)
		}
		if err != nil {
			return time.Since(start), err
		}
		defer sub.Close()
		_, err = sub.Subscribe(ctx, topic)
		waitReady = sub.WaitReady
	}
	if err != nil {
		return time.Since(start), err
	}
	wctx, wcancel := context.WithTimeout(ctx, 2*maxRefusal)
	defer wcancel()
	if err := waitReady(wctx); err != nil && !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		return time.Since(start), err
	} else if err != nil {
		return time.Since(start), fmt.Errorf("WaitReady ran out (%w) without naming a cause", err)
	}
	return time.Since(start), nil
}

// A share member the broker refuses (no READ on the share group; no READ
// on the topic) is refused to the user: Subscribe, Ready or WaitReady
// return an error naming the missing authorization within seconds, not
// "joining share group" for as long as one waits.
func TestSecuredShareRefusedByACL(t *testing.T) {
	t.Parallel()
	c := startSecured(t)
	requireShareGroups(t, c)
	for _, tc := range []struct {
		name  string
		allow func(topic, group string) []kafkatest.ACL
		cause string
	}{
		{"no group ACL", func(topic, _ string) []kafkatest.ACL {
			return []kafkatest.ACL{{Type: sarama.AclResourceTopic, Name: topic, Op: sarama.AclOperationRead}}
		}, "group_authorization_failed"},
		{"no topic ACL", func(_, group string) []kafkatest.ACL {
			return []kafkatest.ACL{{Type: sarama.AclResourceGroup, Name: group, Op: sarama.AclOperationRead}}
		}, "topic_authorization_failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic, group := c.NewTopic(t, 1), c.NewGroup(t)
			user, password := c.NewUser(t)
			c.Allow(t, user, tc.allow(topic, group)...)
			logs := watermill.NewCaptureLogger()
			sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
				Brokers: c.Brokers(), ShareGroup: group, ClientOptions: c.KgoOptsAs(user, password),
				DrainTimeout: 200 * time.Millisecond,
			}, logs)
			require.NoError(t, err)
			defer sub.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := time.Now()
			_, err = sub.Subscribe(ctx, topic)
			if err == nil {
				wctx, wcancel := context.WithTimeout(ctx, 2*maxRefusal)
				err = sub.WaitReady(wctx)
				wcancel()
			}
			took := time.Since(start)
			t.Logf("failed after %v: %v (Ready: %v)", took.Round(time.Millisecond), err, sub.Ready())
			require.Error(t, err)
			assert.Less(t, took, maxRefusal)
			assert.Contains(t, strings.ToLower(strings.ReplaceAll(err.Error(), " ", "_")), tc.cause)
		})
	}
}

// A consumer group the user holds no ACL for is refused to the user
// within seconds: Subscribe or WaitReady return an error naming the group
// authorization, and Ready says so, not "joining" until Sarama's
// coordinator retries run out.
func TestSecuredGroupWithoutACLRefusedPromptly(t *testing.T) {
	t.Parallel()
	c := startSecured(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	user, password := c.NewUser(t)
	c.Allow(t, user, kafkatest.ACL{Type: sarama.AclResourceTopic, Name: topic, Op: sarama.AclOperationRead})
	logs := watermill.NewCaptureLogger()
	sub := newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) {
		asUser(t, c, cfg.OverwriteSaramaConfig, user, password)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	_, err := sub.Subscribe(ctx, topic)
	var readyErr error
	if err == nil {
		wctx, wcancel := context.WithTimeout(ctx, 2*maxRefusal)
		err = sub.WaitReady(wctx)
		wcancel()
		readyErr = sub.Ready()
	}
	took := time.Since(start)
	t.Logf("failed after %v: %v (Ready: %v)", took.Round(time.Millisecond), err, readyErr)
	require.Error(t, err)
	assert.Less(t, took, 5*time.Second)
	assert.ErrorIs(t, err, sarama.ErrGroupAuthorizationFailed)
}

// The first outputs of a transactional router to an output topic ask the
// cluster about that topic once, not once per output: as a least-privilege
// user (no DESCRIBE_CONFIGS), the lookup's failure is logged once.
func TestSecuredTxnFirstOutputsOneLookup(t *testing.T) {
	t.Parallel()
	r, sub, pub, logs, _ := securedTxn(t, 1, 64, func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cfg.MaxInFlight = 64
	})
	c := r.c
	var att attempts
	var gate atomic.Int32
	release := make(chan struct{})
	runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		// Hold the first outputs until all 64 are in hand, so that they
		// reach Publish together, as a busy router's do.
		if gate.Add(1) == 64 {
			close(release)
		}
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		return []*message.Message{outputOf(msg, att.next(msg))}, nil
	})
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	r.requireExactlyOnce(t, rd, r.inputIDs(), 60*time.Second, 30*time.Second)
	lookups := 0
	for _, l := range logs.Captured()[watermill.InfoLogLevel] {
		if strings.Contains(l.Msg, "max.message.bytes") {
			lookups++
		}
	}
	t.Logf("%d Info lines about the output topic's max.message.bytes", lookups)
	assert.Equal(t, 1, lookups, "one lookup of the output topic, not one per output")
}
