//go:build !nolab

package main

// withLab adds the lab commands: a development mesh with an embedded NATS server and
// simulated models, the simulator, drills and the load benchmark. A serving binary built
// with -tags nolab leaves them, and the NATS server and simulator they link, out.
func withLab(m map[string]command) map[string]command {
	m["dev"] = command{"run the whole mesh locally with embedded NATS and simulated models", dev}
	m["sim"] = command{"run the simulated OpenAI-compatible provider", simCommand}
	m["drill"] = command{"run a fault drill through mantle and a naive client, side by side", drill}
	m["bench-load"] = command{"measure the latency mantle adds at fixed request rates", benchLoad}
	return m
}
