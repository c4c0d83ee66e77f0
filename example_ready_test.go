package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

// A readiness probe for a service that consumes with a router: the router
// runs as soon as it subscribed, but the subscriber is ready only once its
// consumer group was joined and its partitions assigned. An unreachable
// broker is not a probe failure to wait out: Subscribe, and so router.Run,
// fails with the connection error.
func ExampleSubscriber_Ready() {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(2, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:       cluster.ListenAddrs(),
		ConsumerGroup: "billing",
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	readyz := func(w http.ResponseWriter, _ *http.Request) {
		if err := sub.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}
	probe := func() int {
		rec := httptest.NewRecorder()
		readyz(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code
	}
	fmt.Println("before the router runs:", probe())

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router.AddConsumerHandler("billing", "orders", sub, func(*message.Message) error { return nil })
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	// Block until the group is joined, e.g. before reporting the service
	// started.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("once the group is joined:", probe())

	_ = router.Close()
	fmt.Println("after Close:", probe(), errors.Is(sub.Ready(), safeack.ErrSubscriberClosed))
	// Output:
	// before the router runs: 503
	// once the group is joined: 200
	// after Close: 503 true
}
