package mesh_test

import (
	"flag"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mantle-mesh/mantle/pkg/mesh/meshtest"
)

// TestMain fails the package's tests when a goroutine they started still runs at the end:
// every goroutine has an owner that ends it.
//
// One exception, in the NATS server, not in mantle: a JetStream API request that creates a
// stream (a KV bucket created on first use) is served on the server's own goroutines, after
// the client that sent it may have gone. When the test's embedded server shuts down while
// such a creation is under way, the new stream's file store is never stopped, and its flush
// loop (with the access-time ticker it registered) outlives Shutdown and WaitForShutdown.
// Only those two server goroutines are ignored; any goroutine of mantle's still fails the
// run.
//
// A test that hangs is reported, with its goroutines, a minute before the binary's timeout
// (meshtest.WatchTimeout).
func TestMain(m *testing.M) {
	flag.Parse()
	meshtest.WatchTimeout(time.Minute)
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}
