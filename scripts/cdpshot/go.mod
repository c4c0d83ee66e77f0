// A tool of the repository's browser test (scripts/browser-test.sh), a
// module of its own so that its WebSocket client stays out of the core
// module's requirements.
module github.com/safeack/safeack/scripts/cdpshot

go 1.26.0

require golang.org/x/net v0.59.0
