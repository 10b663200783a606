package app

import "testing"

func TestDebugListenAddress(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"6060", "127.0.0.1:6060"},
		{":6060", "127.0.0.1:6060"},
		{"0.0.0.0:6060", "0.0.0.0:6060"},
		{"[::1]:6060", "[::1]:6060"},
		{"debug.internal:6060", "debug.internal:6060"},
	} {
		if got := debugListenAddress(tt.in); got != tt.want {
			t.Errorf("debugListenAddress(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
