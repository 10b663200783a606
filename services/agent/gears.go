package agent

import "time"

// failure is what went wrong with one backend call (or why it was not made).
type failure int

const (
	// failNone: the backend answered with a result.
	failNone failure = iota
	// failToolError: the backend answered that the call is wrong (an HTTP 4xx, an MCP
	// result with isError). The answer is the tool's: returned, never retried.
	failToolError
	// failRefused: the backend said it did nothing (connection refused, HTTP 503, 429):
	// an action did not happen.
	failRefused
	// failUnknown: the call may have reached the backend and its outcome is unknown (a
	// timeout, a reset connection, HTTP 500, 502, 504).
	failUnknown
	// failBadResponse: the backend answered something that is not a result (not JSON,
	// too large, against the output schema). For an action the outcome is unknown too.
	failBadResponse
	// failNotCalled: mantle did not call the backend (breaker open, bulkhead full, rate
	// limit): nothing happened.
	failNotCalled
)

func (f failure) String() string {
	switch f {
	case failNone:
		return "none"
	case failToolError:
		return "tool_error"
	case failRefused:
		return "refused"
	case failUnknown:
		return "unknown"
	case failBadResponse:
		return "bad_response"
	case failNotCalled:
		return "not_called"
	}
	return "invalid"
}

// gear is what a tool call does next.
type gear int

const (
	// gearAnswer: answer with the backend's result (or the tool's error answer).
	gearAnswer gear = iota
	// gearRetry: call the same tool again after the backoff.
	gearRetry
	// gearBackup: call the backup tool.
	gearBackup
	// gearStale: answer with the last good result, marked stale with its age.
	gearStale
	// gearGiveUp: TOOL_UNAVAILABLE, marked for a person.
	gearGiveUp
	// gearConfirm: an action whose outcome is unknown: a person confirms whether it
	// happened; the caller sees pending_confirmation.
	gearConfirm
	// gearNotDone: an action that certainly did not happen: its key is released and the
	// caller told, so it may call again (its own decision, never mantle's).
	gearNotDone
)

func (g gear) String() string {
	switch g {
	case gearAnswer:
		return "answer"
	case gearRetry:
		return "retry"
	case gearBackup:
		return "backup"
	case gearStale:
		return "stale"
	case gearGiveUp:
		return "give_up"
	case gearConfirm:
		return "confirm"
	case gearNotDone:
		return "not_done"
	}
	return "invalid"
}

// situation is everything the next gear depends on, read at one instant of the clock.
type situation struct {
	kind    string
	failure failure
	// retries made on the current tool, and the most its retry policy allows.
	retries, maxRetries int
	// delay is the next retry's backoff; left is what remains of the call's deadline.
	delay, left time.Duration
	// budget: the tool's retry budget allows one more retry or backup call.
	budget bool
	// backup: a backup tool not yet tried is configured.
	backup bool
	// staleAge is the age of the last good result of the same call; stale says whether
	// there is one within the tool's max_staleness.
	stale    bool
	staleAge time.Duration
}

// nextGear is the decision table kind × failure → next gear. It is pure: what the clock,
// budgets and stores say is in s.
//
// Actions are never retried and have no backup: a call that may have run is confirmed by
// a person, one that certainly did not run is reported as not done. Queries climb: retry
// (when the failure may pass, the budget allows and the backoff fits before the
// deadline), backup, stale, give up. A tool's own error answer is the answer for every
// kind: calling again would get the same one.
func nextGear(s situation) gear {
	if s.failure == failNone || s.failure == failToolError {
		return gearAnswer
	}
	if s.kind == KindAction {
		if s.failure == failUnknown || s.failure == failBadResponse {
			return gearConfirm
		}
		return gearNotDone
	}
	// A retry of the same tool helps only when the backend was called and may answer
	// next time; one that was not called (open breaker, full bulkhead, rate limit) would
	// be refused again at once.
	retryable := s.failure == failUnknown || s.failure == failRefused || s.failure == failBadResponse
	if retryable && s.retries < s.maxRetries && s.budget && s.delay < s.left {
		return gearRetry
	}
	// A backup call spends the retry budget when the tool itself was called; when it was
	// not (open breaker, full bulkhead), the backup's is the only backend call.
	if s.backup && (s.budget || s.failure == failNotCalled) {
		return gearBackup
	}
	if s.stale {
		return gearStale
	}
	return gearGiveUp
}
