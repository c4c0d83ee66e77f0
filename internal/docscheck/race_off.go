//go:build !race

package docscheck

// raceEnabled: see race_on.go.
const raceEnabled = false
