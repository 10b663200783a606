package meshtest

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// recorded keeps the JSON bodies a recording upstream was sent.
type recorded struct {
	mu     sync.Mutex
	bodies []map[string]json.RawMessage
}

// Last is the body of the latest request.
func (u *recorded) Last(t testing.TB) map[string]json.RawMessage {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		t.Fatal("the upstream received nothing")
	}
	return u.bodies[len(u.bodies)-1]
}

// Count is how many requests arrived.
func (u *recorded) Count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.bodies)
}

func (u *recorded) add(body map[string]json.RawMessage) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.bodies = append(u.bodies, body)
}

// serveLast answers GET .../recorded/last with the latest body, for tests in other
// languages; false when r asks for something else.
func (u *recorded) serveLast(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/recorded/last") {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		http.NotFound(w, r)
		return true
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(u.bodies[len(u.bodies)-1])
	return true
}
