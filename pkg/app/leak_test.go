package app

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine they started still runs at the end:
// every goroutine has an owner that ends it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
