//go:build race

package docscheck

// raceEnabled: this binary was built with -race, so CompileBlocks builds
// with it too, and finds the packages its blocks import in the build
// cache, compiled already for the tests.
const raceEnabled = true
