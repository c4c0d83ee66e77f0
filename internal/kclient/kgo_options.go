package kclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// KgoOptions carries the connection settings of a Sarama config over to a
// franz-go client: dial timeout, client ID, TLS, proxy, local address and
// keep-alive, and SASL PLAIN, SCRAM and OAUTHBEARER. A SASL mechanism that
// cannot be carried over (GSSAPI) is an error.
func KgoOptions(conf *sarama.Config) ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.DialTimeout(conf.Net.DialTimeout)}
	if conf.ClientID != "" {
		opts = append(opts, kgo.ClientID(conf.ClientID))
	}
	var tlsConf *tls.Config
	if conf.Net.TLS.Enable {
		tlsConf = &tls.Config{}
		if conf.Net.TLS.Config != nil {
			tlsConf = conf.Net.TLS.Config.Clone()
		}
	}
	if conf.Net.Proxy.Enable || conf.Net.LocalAddr != nil || conf.Net.KeepAlive != 0 {
		d := &net.Dialer{Timeout: conf.Net.DialTimeout, KeepAlive: conf.Net.KeepAlive, LocalAddr: conf.Net.LocalAddr}
		opts = append(opts, kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
			var conn net.Conn
			var err error
			if conf.Net.Proxy.Enable && conf.Net.Proxy.Dialer != nil {
				conn, err = conf.Net.Proxy.Dialer.Dial(network, host)
			} else {
				conn, err = d.DialContext(ctx, network, host)
			}
			if err != nil || tlsConf == nil {
				return conn, err
			}
			c := tlsConf.Clone()
			if c.ServerName == "" {
				c.ServerName, _, _ = net.SplitHostPort(host)
			}
			tc := tls.Client(conn, c)
			if err := tc.HandshakeContext(ctx); err != nil {
				conn.Close()
				return nil, err
			}
			return tc, nil
		}))
	} else if tlsConf != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsConf))
	}
	if !conf.Net.SASL.Enable {
		return opts, nil
	}
	s := conf.Net.SASL
	switch s.Mechanism {
	case "", sarama.SASLTypePlaintext:
		opts = append(opts, kgo.SASL(plain.Auth{Zid: s.AuthIdentity, User: s.User, Pass: s.Password}.AsMechanism()))
	case sarama.SASLTypeSCRAMSHA256:
		opts = append(opts, kgo.SASL(scram.Auth{Zid: s.SCRAMAuthzID, User: s.User, Pass: s.Password}.AsSha256Mechanism()))
	case sarama.SASLTypeSCRAMSHA512:
		opts = append(opts, kgo.SASL(scram.Auth{Zid: s.SCRAMAuthzID, User: s.User, Pass: s.Password}.AsSha512Mechanism()))
	case sarama.SASLTypeOAuth:
		if s.TokenProvider == nil {
			return nil, errors.New("SASL OAUTHBEARER without a token provider")
		}
		provider := s.TokenProvider
		opts = append(opts, kgo.SASL(oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			tok, err := provider.Token()
			if err != nil {
				return oauth.Auth{}, err
			}
			return oauth.Auth{Token: tok.Token, Extensions: tok.Extensions}, nil
		})))
	default:
		return nil, fmt.Errorf("SASL mechanism %s cannot be carried over to a franz-go client", s.Mechanism)
	}
	return opts, nil
}
