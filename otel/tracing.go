package safeackotel

import (
	"reflect"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracing is the tracer an Observer starts spans with, and whether its
// provider is a no-op one, whose spans never record: then no span is
// started at all. A no-op tracer still allocates a span and a context per
// span (three allocations a delivery), which is most of what an Observer
// would cost an application that installed no SDK.
type tracing struct {
	tp     trace.TracerProvider
	tracer trace.Tracer
	off    bool
}

func newTracing(tp trace.TracerProvider) *tracing {
	return &tracing{tp: tp, tracer: tp.Tracer(ScopeName), off: isNoopProvider(tp)}
}

// currentTracing is the tracing to use now. An Observer on the global
// provider reads it again at each delivery (an atomic load), so that
// spans start once the application sets a provider, before or after
// NewObserver.
func (o *Observer) currentTracing() *tracing {
	t := o.tracing.Load()
	if !o.cfg.globalTP {
		return t
	}
	if tp := otel.GetTracerProvider(); !sameProvider(tp, t.tp) {
		t = newTracing(tp)
		o.tracing.Store(t)
	}
	return t
}

// sameProvider reports whether a and b are the same provider, without
// comparing values of a type that cannot be compared (that would panic).
func sameProvider(a, b trace.TracerProvider) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// isNoopProvider reports whether tp is one of OpenTelemetry's no-op
// providers: package noop's, the deprecated trace.NewNoopTracerProvider's,
// or the global one before an SDK is set (its spans are no-op spans until
// otel.SetTracerProvider; the global provider is then the SDK's). An
// unknown provider counts as a live one: spans are started and asked
// whether they record.
func isNoopProvider(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return true
	}
	t := reflect.TypeOf(tp)
	if t == nil {
		return true
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.PkgPath() + "." + t.Name() {
	case "go.opentelemetry.io/otel/internal/global.tracerProvider",
		"go.opentelemetry.io/otel/trace.noopTracerProvider":
		return true
	}
	return false
}
