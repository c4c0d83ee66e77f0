package kafkatest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
	kgosasl "github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// The environment of a secured real cluster, as scripts/kafka.sh start
// prints it for SAFEACK_KAFKA_SECURITY=sasl_ssl. They are read only with
// SAFEACK_KAFKA_BROKERS (the embedded broker is never secured this way).
// TLS is on when EnvCA is set, SASL when EnvSASLMechanism is.
const (
	// EnvSASLMechanism names the SASL mechanism: SCRAM-SHA-512,
	// SCRAM-SHA-256 or PLAIN.
	EnvSASLMechanism = "SAFEACK_KAFKA_SASL_MECHANISM"
	// EnvSASLUser and EnvSASLPassword are the harness's login: a super
	// user, for the harness creates topics, users and ACLs.
	EnvSASLUser     = "SAFEACK_KAFKA_SASL_USER"
	EnvSASLPassword = "SAFEACK_KAFKA_SASL_PASSWORD" // #nosec G101 -- the name of a variable
	// EnvCA is the PEM file of the CA that signed the brokers'
	// certificates; setting it turns TLS on.
	EnvCA = "SAFEACK_KAFKA_CA"
	// EnvTLSServerName is the name the brokers' certificates are checked
	// against; empty: the host of the address dialled.
	EnvTLSServerName = "SAFEACK_KAFKA_TLS_SERVER_NAME"
)

// Security is how a client of a secured cluster connects: TLS with a CA
// and server name, and a SASL login. The zero value is a plaintext
// connection without login.
type Security struct {
	// CAFile is the PEM file of the CA the client trusts; empty: no TLS.
	CAFile string
	// ServerName is the name the broker's certificate must carry; empty:
	// the host dialled.
	ServerName string
	// Mechanism is the SASL mechanism (sarama.SASLTypeSCRAMSHA512, ...);
	// empty: no SASL.
	Mechanism string
	// User and Password are the SASL login.
	User, Password string
}

// securityFromEnv reads the Env* variables; ok is false when neither TLS
// nor SASL is asked for.
func securityFromEnv() (s Security, ok bool, err error) {
	s = Security{
		CAFile:     strings.TrimSpace(os.Getenv(EnvCA)),
		ServerName: strings.TrimSpace(os.Getenv(EnvTLSServerName)),
		Mechanism:  strings.ToUpper(strings.TrimSpace(os.Getenv(EnvSASLMechanism))),
		User:       os.Getenv(EnvSASLUser),
		Password:   os.Getenv(EnvSASLPassword),
	}
	if s.CAFile == "" && s.Mechanism == "" {
		return Security{}, false, nil
	}
	if s.Mechanism != "" {
		if _, err := mechanism(s.Mechanism, "", ""); err != nil {
			return Security{}, false, fmt.Errorf("%s=%q: %w", EnvSASLMechanism, s.Mechanism, err)
		}
		if s.User == "" {
			return Security{}, false, fmt.Errorf("%s=%s but %s is empty", EnvSASLMechanism, s.Mechanism, EnvSASLUser)
		}
	}
	if s.CAFile != "" {
		if _, err := s.TLSConfig(); err != nil {
			return Security{}, false, fmt.Errorf("%s: %w", EnvCA, err)
		}
	}
	return s, true, nil
}

// mechanism returns the franz-go SASL mechanism named name, logging in as
// user.
func mechanism(name, user, pass string) (kgosasl.Mechanism, error) {
	switch name {
	case sarama.SASLTypeSCRAMSHA512:
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	case sarama.SASLTypeSCRAMSHA256:
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case sarama.SASLTypePlaintext:
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	}
	return nil, fmt.Errorf("SASL mechanism %q is not one of %s, %s, %s", name,
		sarama.SASLTypeSCRAMSHA512, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypePlaintext)
}

// TLSConfig returns the TLS config of s: its CA as the only root, its
// server name, TLS 1.2 or later; nil when s has no CA.
func (s Security) TLSConfig() (*tls.Config, error) {
	if s.CAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(s.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", s.CAFile)
	}
	return &tls.Config{RootCAs: pool, ServerName: s.ServerName, MinVersion: tls.VersionTLS12}, nil
}

// As returns s with another SASL login (same mechanism and TLS).
func (s Security) As(user, password string) Security {
	s.User, s.Password = user, password
	return s
}

// ApplySarama sets cfg's Net.TLS and Net.SASL to connect as s says. A
// SCRAM login gets a SCRAMClientGeneratorFunc (SCRAMClient).
func (s Security) ApplySarama(cfg *sarama.Config) error {
	tc, err := s.TLSConfig()
	if err != nil {
		return err
	}
	cfg.Net.TLS.Enable = tc != nil
	cfg.Net.TLS.Config = tc
	cfg.Net.SASL.Enable = s.Mechanism != ""
	if s.Mechanism == "" {
		return nil
	}
	cfg.Net.SASL.Mechanism = sarama.SASLMechanism(s.Mechanism)
	cfg.Net.SASL.Handshake = true
	cfg.Net.SASL.User, cfg.Net.SASL.Password = s.User, s.Password
	switch s.Mechanism {
	case sarama.SASLTypeSCRAMSHA512, sarama.SASLTypeSCRAMSHA256:
		mech := s.Mechanism
		cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return SCRAMClient(mech) }
	}
	return nil
}

// KgoOpts returns the franz-go options that connect as s says
// (kgo.DialTLSConfig, kgo.SASL); none for the zero Security.
func (s Security) KgoOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	tc, err := s.TLSConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if s.Mechanism != "" {
		m, err := mechanism(s.Mechanism, s.User, s.Password)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// SCRAMClient returns a sarama.SCRAMClient for mechanism
// (sarama.SASLTypeSCRAMSHA512 or SCRAMSHA256) on franz-go's SCRAM
// implementation (github.com/twmb/franz-go/pkg/sasl/scram, which checks
// the server's signature): a SCRAM client without a module of its own, as
// franz-go is already one of safeack's.
func SCRAMClient(mechanism string) sarama.SCRAMClient {
	return &scramClient{sha512: mechanism == sarama.SASLTypeSCRAMSHA512}
}

type scramClient struct {
	sha512  bool
	auth    scram.Auth
	session kgosasl.Session
	done    bool
}

func (c *scramClient) Begin(user, password, authzID string) error {
	c.auth = scram.Auth{Zid: authzID, User: user, Pass: password}
	c.session, c.done = nil, false
	return nil
}

// Step answers the server's challenge: the first call (challenge "")
// returns the client-first message, the next ones feed the session.
func (c *scramClient) Step(challenge string) (string, error) {
	if c.session == nil {
		m := c.auth.AsSha256Mechanism()
		if c.sha512 {
			m = c.auth.AsSha512Mechanism()
		}
		s, first, err := m.Authenticate(context.Background(), "")
		if err != nil {
			return "", err
		}
		c.session = s
		return string(first), nil
	}
	done, next, err := c.session.Challenge([]byte(challenge))
	if err != nil {
		return "", err
	}
	c.done = done
	return string(next), nil
}

func (c *scramClient) Done() bool { return c.done }

// Secured reports whether the cluster is a real one reached over TLS or
// SASL (the Env* variables).
func (c *Cluster) Secured() bool { return c.sec != nil }

// Security returns how the harness connects: the zero Security on a
// plaintext cluster.
func (c *Cluster) Security() Security {
	if c.sec == nil {
		return Security{}
	}
	return *c.sec
}

// RequireSecured skips the test unless the cluster is secured.
func (c *Cluster) RequireSecured(tb testing.TB) {
	tb.Helper()
	if c.sec == nil {
		tb.Skipf("kafkatest: needs a secured real cluster: start one with SAFEACK_KAFKA_SECURITY=sasl_ssl scripts/kafka.sh start and export what it prints (%s, %s, %s, %s, %s)",
			EnvBrokers, EnvSASLMechanism, EnvSASLUser, EnvSASLPassword, EnvCA)
	}
}

// KgoOpts returns the franz-go options that connect to the cluster as the
// harness does (TLS, SASL as its super user): none on a plaintext cluster.
// Add them to every kgo client a test makes.
func (c *Cluster) KgoOpts() []kgo.Opt {
	if c.sec == nil {
		return nil
	}
	opts, err := c.sec.KgoOpts()
	if err != nil {
		panic(err) // checked by Start
	}
	return opts
}

// NewUser creates a SCRAM user (the cluster's SASL mechanism, 4096
// iterations) named after the test, with a random password, and returns
// its name and password; it is deleted at cleanup. The user holds no ACL:
// see Allow.
func (c *Cluster) NewUser(tb testing.TB) (user, password string) {
	tb.Helper()
	c.RequireSecured(tb)
	mech := sarama.SCRAM_MECHANISM_SHA_512
	if c.sec.Mechanism == sarama.SASLTypeSCRAMSHA256 {
		mech = sarama.SCRAM_MECHANISM_SHA_256
	} else if c.sec.Mechanism != sarama.SASLTypeSCRAMSHA512 {
		tb.Skipf("kafkatest: NewUser makes SCRAM users; the cluster's mechanism is %s", c.sec.Mechanism)
	}
	user = uniqueName("u-", tb.Name())
	password, salt := randomHex(16), make([]byte, 16)
	_, _ = rand.Read(salt)
	_, admin := c.clients(tb)
	res, err := admin.UpsertUserScramCredentials([]sarama.AlterUserScramCredentialsUpsert{{
		Name: user, Mechanism: mech, Iterations: 4096, Salt: salt, Password: []byte(password),
	}})
	if err == nil {
		for _, r := range res {
			if r.ErrorCode != sarama.ErrNoError {
				err = fmt.Errorf("%s: %w %s", r.User, r.ErrorCode, deref(r.ErrorMessage))
			}
		}
	}
	if err != nil {
		tb.Fatalf("kafkatest: creating SCRAM user %s: %v", user, err)
	}
	tb.Cleanup(func() {
		_, admin := c.clients(tb)
		_, _ = admin.DeleteUserScramCredentials([]sarama.AlterUserScramCredentialsDelete{{Name: user, Mechanism: mech}})
	})
	// The credentials reach the broker's SCRAM cache with the metadata
	// record: a login before that fails. Wait until one succeeds.
	WaitFor(tb, 15*time.Second, "user "+user+" to log in", func() bool {
		cfg := c.SaramaConfigAs(user, password)
		cl, err := sarama.NewClient(c.brokers, cfg)
		if err != nil {
			return false
		}
		_ = cl.Close()
		return true
	})
	return user, password
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// SaramaConfigAs is SaramaConfig logging in as user instead of the
// harness's super user (same TLS and mechanism).
func (c *Cluster) SaramaConfigAs(user, password string) *sarama.Config {
	cfg := c.SaramaConfig()
	if c.sec != nil {
		if err := c.sec.As(user, password).ApplySarama(cfg); err != nil {
			panic(err) // checked by Start
		}
	}
	return cfg
}

// KgoOptsAs is KgoOpts logging in as user.
func (c *Cluster) KgoOptsAs(user, password string) []kgo.Opt {
	if c.sec == nil {
		return nil
	}
	opts, err := c.sec.As(user, password).KgoOpts()
	if err != nil {
		panic(err) // checked by Start
	}
	return opts
}

// ACL is one permission for Allow: operation op on the resource of type
// Type named Name (a prefix when Prefixed).
type ACL struct {
	Type     sarama.AclResourceType
	Name     string
	Prefixed bool
	Op       sarama.AclOperation
}

// Allow grants user each of acls (ALLOW, any host), removed at cleanup,
// and waits until the broker's authorizer has them (ACLs reach it with the
// metadata, a moment after CreateAcls answers): DescribeAcls shows them.
func (c *Cluster) Allow(tb testing.TB, user string, acls ...ACL) {
	tb.Helper()
	c.RequireSecured(tb)
	_, admin := c.clients(tb)
	principal := "User:" + user
	var ras []*sarama.ResourceAcls
	for _, a := range acls {
		pt := sarama.AclPatternLiteral
		if a.Prefixed {
			pt = sarama.AclPatternPrefixed
		}
		ras = append(ras, &sarama.ResourceAcls{
			Resource: sarama.Resource{ResourceType: a.Type, ResourceName: a.Name, ResourcePatternType: pt},
			Acls:     []*sarama.Acl{{Principal: principal, Host: "*", Operation: a.Op, PermissionType: sarama.AclPermissionAllow}},
		})
	}
	if err := admin.CreateACLs(ras); err != nil {
		tb.Fatalf("kafkatest: creating ACLs for %s: %v", user, err)
	}
	filter := sarama.AclFilter{
		Version:                   1,
		ResourceType:              sarama.AclResourceAny,
		ResourcePatternTypeFilter: sarama.AclPatternAny,
		Principal:                 &principal,
		Operation:                 sarama.AclOperationAny,
		PermissionType:            sarama.AclPermissionAny,
	}
	tb.Cleanup(func() {
		_, admin := c.clients(tb)
		_, _ = admin.DeleteACL(filter, false)
	})
	WaitFor(tb, 15*time.Second, fmt.Sprintf("%d ACLs of %s to be listed", len(acls), user), func() bool {
		got, err := admin.ListAcls(filter)
		if err != nil {
			return false
		}
		n := 0
		for _, r := range got {
			n += len(r.Acls)
		}
		return n >= len(acls)
	})
}

// EnvSecurity returns the Security the Env* variables describe when
// SAFEACK_KAFKA_BROKERS names a real cluster, else the zero Security: for
// a test's child process, which builds its own clients.
func EnvSecurity() (Security, error) {
	if strings.TrimSpace(os.Getenv(EnvBrokers)) == "" {
		return Security{}, nil
	}
	s, _, err := securityFromEnv()
	return s, err
}

// Secure sets cfg's TLS and SASL login to the harness's (the super user's)
// on a secured cluster, and returns cfg; on a plaintext cluster it returns
// cfg unchanged. For tests that start from a default config (safeack's or
// watermill-kafka's) rather than SaramaConfig.
func (c *Cluster) Secure(cfg *sarama.Config) *sarama.Config {
	if c.sec != nil {
		if err := c.sec.ApplySarama(cfg); err != nil {
			panic(err) // checked by Start
		}
	}
	return cfg
}
