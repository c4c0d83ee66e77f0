package keygate

import (
	"math/rand/v2"
	"testing"
)

func TestAdmitReleaseInOrder(t *testing.T) {
	g := New[int]()
	if !g.Admit(1, 10) {
		t.Fatal("first item of an idle key must start")
	}
	if !g.Admit(2, 20) {
		t.Fatal("another key must not wait for key 1")
	}
	for _, v := range []int{11, 12} {
		if g.Admit(1, v) {
			t.Fatalf("item %d of a busy key started", v)
		}
	}
	if g.Waiting() != 2 || g.Busy() != 2 {
		t.Fatalf("waiting %d busy %d, want 2 2", g.Waiting(), g.Busy())
	}
	for _, want := range []int{11, 12} {
		got, ok := g.Release(1)
		if !ok || got != want {
			t.Fatalf("Release = %d, %v; want %d, true", got, ok, want)
		}
	}
	if _, ok := g.Release(1); ok {
		t.Fatal("release of a key with nothing waiting returned an item")
	}
	if g.Busy() != 1 {
		t.Fatalf("busy %d, want 1", g.Busy())
	}
	if !g.Admit(1, 13) {
		t.Fatal("key 1 is idle again and must start at once")
	}
	if _, ok := g.Release(99); ok {
		t.Fatal("releasing an idle key returned an item")
	}
}

func TestDrain(t *testing.T) {
	g := New[int]()
	g.Admit(1, 0)
	g.Admit(1, 1)
	g.Admit(1, 2)
	g.Admit(2, 0)
	var got []int
	g.Drain(func(v int) { got = append(got, v) })
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("drained %v, want [1 2]", got)
	}
	if g.Busy() != 0 || g.Waiting() != 0 {
		t.Fatal("drain must leave every key idle")
	}
}

// TestModel drives the gate with random operations against a naive model:
// per key, a running flag and a FIFO.
func TestModel(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	g := New[int]()
	type lane struct {
		running bool
		queue   []int
	}
	model := map[uint64]*lane{}
	for i := range 100_000 {
		key := uint64(rng.IntN(20))
		l := model[key]
		if l == nil {
			l = &lane{}
			model[key] = l
		}
		if rng.IntN(2) == 0 {
			started := g.Admit(key, i)
			if started != !l.running {
				t.Fatalf("op %d: Admit(%d) = %v, model running %v", i, key, started, l.running)
			}
			if started {
				l.running = true
			} else {
				l.queue = append(l.queue, i)
			}
			continue
		}
		got, ok := g.Release(key)
		switch {
		case !l.running:
			if ok {
				t.Fatalf("op %d: release of idle key %d returned %d", i, key, got)
			}
		case len(l.queue) == 0:
			if ok {
				t.Fatalf("op %d: release returned %d, model has none waiting", i, got)
			}
			l.running = false
		default:
			if !ok || got != l.queue[0] {
				t.Fatalf("op %d: release = %d,%v; model %d", i, got, ok, l.queue[0])
			}
			l.queue = l.queue[1:]
		}
		if n := g.WaitingFor(key); n != len(l.queue) {
			t.Fatalf("op %d: WaitingFor(%d) = %d, model %d", i, key, n, len(l.queue))
		}
	}
}

// BenchmarkAdmitRelease measures one admit and one release of a key in
// steady state, with keys distinct keys busy; the cost must not grow with
// keys.
func BenchmarkAdmitRelease(b *testing.B) {
	for _, keys := range []int{1, 1_000, 100_000} {
		b.Run(itoa(keys)+"keys", func(b *testing.B) {
			g := New[int]()
			for k := range keys {
				g.Admit(uint64(k), k)
				g.Admit(uint64(k), k) // one waiting item per key
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := uint64(i % keys)
				g.Admit(k, i)
				g.Release(k)
			}
		})
	}
}

func itoa(n int) string {
	switch n {
	case 1:
		return "1"
	case 1_000:
		return "1k"
	}
	return "100k"
}
