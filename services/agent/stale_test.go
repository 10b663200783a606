package agent

import (
	"strings"
	"testing"
	"time"
)

func TestStaleStoreBounds(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newStaleStore(2, 1<<20)
	for i, args := range []string{"a", "b", "c"} {
		s.put(staleKey{"acme", "weather", args}, `{"n":`+args+`}`, t0.Add(time.Duration(i)*time.Minute))
	}
	s.put(staleKey{"acme", "stock", "a"}, `{}`, t0)
	if _, _, ok := s.get(staleKey{"acme", "weather", "a"}); ok {
		t.Error("the oldest result of a tool over max_entries is kept")
	}
	if got, stored, ok := s.get(staleKey{"acme", "weather", "c"}); !ok || got != `{"n":c}` || !stored.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("get c = %q, %v, %t", got, stored, ok)
	}
	if s.count("weather") != 2 || s.count("stock") != 1 {
		t.Errorf("counts = %d, %d, want 2, 1 (one tool's entries do not evict another's)", s.count("weather"), s.count("stock"))
	}
	if _, _, ok := s.get(staleKey{"other", "weather", "c"}); ok {
		t.Error("another tenant reads acme's result")
	}
	s.dropTool("weather")
	if s.count("weather") != 0 {
		t.Error("dropTool kept results")
	}

	small := newStaleStore(100, 1000)
	big := strings.Repeat("x", 400)
	for _, args := range []string{"a", "b", "c"} {
		small.put(staleKey{"acme", "t", args}, big, t0)
	}
	if _, _, ok := small.get(staleKey{"acme", "t", "a"}); ok || small.bytes > 1000 {
		t.Errorf("store over max_bytes: %d bytes, oldest kept %t", small.bytes, ok)
	}
	small.put(staleKey{"acme", "t", "huge"}, strings.Repeat("x", 2000), t0)
	if _, _, ok := small.get(staleKey{"acme", "t", "huge"}); ok {
		t.Error("a result larger than the store is kept")
	}
}
