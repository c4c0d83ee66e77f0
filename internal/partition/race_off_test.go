//go:build !race

package partition

// raceEnabled tells tests the race detector is on.
const raceEnabled = false
