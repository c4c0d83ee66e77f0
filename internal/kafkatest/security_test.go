package kafkatest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IBM/sarama"
)

// The Env* variables: nothing set is plaintext; a CA turns TLS on, a
// mechanism SASL; a bad mechanism, a mechanism without a user and a CA
// file without a certificate are refused with the variable named.
func TestSecurityFromEnv(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("no certificate here"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		secured bool
		err     string // in the error; "" none
	}{
		{name: "plaintext", env: nil},
		{name: "SCRAM without TLS", env: map[string]string{EnvSASLMechanism: "scram-sha-512", EnvSASLUser: "u", EnvSASLPassword: "p"}, secured: true},
		{name: "unknown mechanism", env: map[string]string{EnvSASLMechanism: "GSSAPI", EnvSASLUser: "u"}, err: EnvSASLMechanism},
		{name: "no user", env: map[string]string{EnvSASLMechanism: "SCRAM-SHA-256"}, err: EnvSASLUser},
		{name: "CA without a certificate", env: map[string]string{EnvCA: notPEM}, err: "no PEM certificate"},
		{name: "CA missing", env: map[string]string{EnvCA: filepath.Join(dir, "missing.pem")}, err: EnvCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{EnvSASLMechanism, EnvSASLUser, EnvSASLPassword, EnvCA, EnvTLSServerName} {
				t.Setenv(k, tc.env[k])
			}
			s, ok, err := securityFromEnv()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil || ok != tc.secured {
				t.Fatalf("secured %v, error %v; want secured %v", ok, err, tc.secured)
			}
			cfg := sarama.NewConfig()
			if err := s.ApplySarama(cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.Net.SASL.Enable != tc.secured || cfg.Net.TLS.Enable {
				t.Fatalf("SASL %v, TLS %v", cfg.Net.SASL.Enable, cfg.Net.TLS.Enable)
			}
			if tc.secured && (cfg.Net.SASL.Mechanism != sarama.SASLTypeSCRAMSHA512 || cfg.Net.SASL.SCRAMClientGeneratorFunc == nil) {
				t.Fatalf("mechanism %q, SCRAM client %v", cfg.Net.SASL.Mechanism, cfg.Net.SASL.SCRAMClientGeneratorFunc != nil)
			}
		})
	}
}

// The SCRAM client's first step is the client-first message of RFC 5802
// for the user; a server-first message with another nonce is refused.
func TestSCRAMClientFirstSteps(t *testing.T) {
	c := SCRAMClient(sarama.SASLTypeSCRAMSHA512)
	if err := c.Begin("alice", "secret", ""); err != nil {
		t.Fatal(err)
	}
	first, err := c.Step("")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, "n,,n=alice,r=") {
		t.Fatalf("client-first message %q", first)
	}
	if _, err := c.Step("r=another-nonce,s=c2FsdA==,i=4096"); err == nil {
		t.Fatal("a server nonce not extending the client's was taken")
	}
	if c.Done() {
		t.Fatal("done after a refused exchange")
	}
}
