//go:build race

package safeack_test

// raceEnabled tells tests the race detector is on.
const raceEnabled = true
