package verifier

import (
	"container/list"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// sessions remembers, per (tenant, session), what context risk needs: how many delivered
// answers in a row were degraded, and when the user last said they were dissatisfied. It
// also maps recent request ids to their session so that feedback naming only a request
// finds it. Memory is bounded (least recently used sessions go first) and per replica: a
// session whose requests land on several replicas is seen in parts, which only weakens a
// signal that is a heuristic anyway.
type sessions struct {
	clock  clockwork.Clock
	ttl    time.Duration
	window time.Duration
	max    int

	mu       sync.Mutex
	order    *list.List // of *session, most recently used first
	byKey    map[string]*list.Element
	requests map[string]string // tenant/request id -> session key
	reqOrder *list.List        // of request keys, oldest last, bounding requests
}

type session struct {
	key            string
	seen           time.Time
	streak         int    // degraded answers in a row
	lastRequest    string // the request last counted, so retries of one request count once
	dissatisfiedAt time.Time
}

func newSessions(cfg RiskConfig, clock clockwork.Clock) *sessions {
	return &sessions{
		clock: clock, ttl: cfg.SessionTTL, window: cfg.FeedbackWindow, max: cfg.MaxSessions,
		order: list.New(), byKey: map[string]*list.Element{},
		requests: map[string]string{}, reqOrder: list.New(),
	}
}

func sessionKey(tenant, id string) string { return tenant + "/" + id }

// get returns the live session for key, creating it when create is set.
func (s *sessions) get(key string, create bool) *session {
	now := s.clock.Now()
	if el, ok := s.byKey[key]; ok {
		ss := el.Value.(*session)
		if now.Sub(ss.seen) < s.ttl {
			ss.seen = now
			s.order.MoveToFront(el)
			return ss
		}
		s.order.Remove(el)
		delete(s.byKey, key)
	}
	if !create {
		return nil
	}
	ss := &session{key: key, seen: now}
	s.byKey[key] = s.order.PushFront(ss)
	for s.order.Len() > s.max {
		oldest := s.order.Back()
		s.order.Remove(oldest)
		delete(s.byKey, oldest.Value.(*session).key)
	}
	return ss
}

// context returns the degraded streak the session would have with this answer delivered,
// and whether its user recently reported dissatisfaction.
func (s *sessions) context(tenant, id, requestID string, degraded bool) (int, bool) {
	if id == "" {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.get(sessionKey(tenant, id), false)
	if ss == nil {
		if degraded {
			return 1, false
		}
		return 0, false
	}
	streak := ss.streak
	switch {
	case requestID != "" && requestID == ss.lastRequest:
		// Another candidate of a request already counted.
	case degraded:
		streak++
	default:
		streak = 0
	}
	return streak, !ss.dissatisfiedAt.IsZero() && s.clock.Since(ss.dissatisfiedAt) < s.window
}

// delivered records an answer that passed verification.
func (s *sessions) delivered(tenant, id, requestID string, degraded bool) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := sessionKey(tenant, id)
	ss := s.get(key, true)
	if requestID == "" || requestID != ss.lastRequest {
		if degraded {
			ss.streak++
		} else {
			ss.streak = 0
		}
		ss.lastRequest = requestID
	}
	if requestID == "" {
		return
	}
	rk := sessionKey(tenant, requestID)
	if _, ok := s.requests[rk]; !ok {
		s.reqOrder.PushFront(rk)
		for s.reqOrder.Len() > s.max {
			oldest := s.reqOrder.Back()
			s.reqOrder.Remove(oldest)
			delete(s.requests, oldest.Value.(string))
		}
	}
	s.requests[rk] = key
}

// feedback records a user's judgement against a session (named, or found by request id)
// and returns the session id it used, "" when there was none.
func (s *sessions) feedback(tenant, id, requestID string, dissatisfied bool) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := ""
	if id != "" {
		key = sessionKey(tenant, id)
	} else if k, ok := s.requests[sessionKey(tenant, requestID)]; ok {
		key = k
	}
	if key == "" {
		return ""
	}
	ss := s.get(key, true)
	if dissatisfied {
		ss.dissatisfiedAt = s.clock.Now()
	} else {
		ss.dissatisfiedAt = time.Time{}
	}
	return key[len(tenant)+1:]
}
