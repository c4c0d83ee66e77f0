package kclient

import (
	"errors"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack/internal/kafkatest"
)

// TestCoordinatorClient: the group coordinator comes on a connection of its
// own (a Broker other than the one the client fetches from, at the same
// address), the same one every time, reopened after Sarama closed it on an
// error, and closed with the client.
func TestCoordinatorClient(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	group := c.NewGroup(t)
	inner, err := sarama.NewClient(c.Brokers(), c.SaramaConfig())
	require.NoError(t, err)
	cc := NewCoordinatorClient(inner)

	shared, err := inner.Coordinator(group)
	require.NoError(t, err)
	own, err := cc.Coordinator(group)
	require.NoError(t, err)
	require.NotSame(t, shared, own, "the coordinator shares the fetching connection")
	require.Equal(t, shared.Addr(), own.Addr())
	again, err := cc.Coordinator(group)
	require.NoError(t, err)
	require.Same(t, own, again)

	fetch := func(b *sarama.Broker) error {
		req := sarama.NewOffsetFetchRequest(inner.Config().Version, group, map[string][]int32{"none": {0}})
		_, err := b.FetchOffset(req)
		return err
	}
	require.NoError(t, fetch(own))

	// Sarama closes a coordinator connection after a failed request and
	// asks Coordinator again.
	require.NoError(t, own.Close())
	reopened, err := cc.Coordinator(group)
	require.NoError(t, err)
	require.Same(t, own, reopened)
	require.NoError(t, fetch(reopened))

	require.NoError(t, cc.Close())
	ok, _ := own.Connected()
	require.False(t, ok, "the coordinator connection outlived Close")
	require.True(t, inner.Closed())
	_, err = cc.Coordinator(group)
	require.True(t, errors.Is(err, sarama.ErrClosedClient), "Coordinator after Close: %v", err)
}
