package consume

import "sync"

// lockedMap is a map for concurrent use, made on its first set.
type lockedMap[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]V
}

func (l *lockedMap[K, V]) get(k K) (V, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.m[k]
	return v, ok
}

func (l *lockedMap[K, V]) set(k K, v V) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[K]V)
	}
	l.m[k] = v
}

func (l *lockedMap[K, V]) delete(keys ...K) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		delete(l.m, k)
	}
}
