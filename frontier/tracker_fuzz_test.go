package frontier_test

import (
	"math/rand/v2"
	"testing"
)

// FuzzTracker decodes an operation stream from the fuzz input (each byte is a
// decision of the model harness in tracker_model_test.go: which partition,
// which operation, batch sizes, holes, broken rules, which ticket), drives two
// trackers and their naive references with it, and requires that nothing
// panics and that tracker and reference agree after every operation.
//
//	go test -fuzz=FuzzTracker -fuzztime=30s ./frontier/
func FuzzTracker(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	// Offer, offer, complete out of order, revoke, replace.
	f.Add([]byte{100, 3, 50, 5, 0, 2, 1, 1, 0, 0, 0, 12, 1, 2, 0, 14, 0, 12, 1, 30, 0, 30, 0})
	// A few streams from a seeded generator so the corpus starts varied.
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 99))
		b := make([]byte, 64+r.IntN(1024))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &byteChooser{b: data}
		m := newModel(t, c, "FuzzTracker input")
		m.run(4096)
	})
}
