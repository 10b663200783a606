//go:build nolab

package main

// withLab adds nothing: this is the serving build (-tags nolab), without dev, sim, drill
// and bench-load.
func withLab(m map[string]command) map[string]command { return m }
