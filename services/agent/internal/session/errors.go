package session

import (
	"errors"
	"fmt"
)

// Errors of the session manager; the agent's server maps them to gRPC statuses.
var (
	// ErrSessionNotFound: no session has the id for this tenant (or it has expired).
	ErrSessionNotFound = errors.New("session not found")
	// ErrEnded: the session was completed, cancelled or ran out of budget. *EndedError
	// carries which.
	ErrEnded = errors.New("session ended")
	// ErrStepNotFound: EndStep for a step that was never begun.
	ErrStepNotFound = errors.New("step not found in the session")
	// ErrStepConflict: a step id reused for another kind of step or another request.
	ErrStepConflict = errors.New("step id reused for another step")
	// ErrStepInProgress: the step is running elsewhere and its runner's lease holds.
	ErrStepInProgress = errors.New("step is running")
	// ErrTooManySessions: the tenant opens sessions faster than it may.
	ErrTooManySessions = errors.New("too many new sessions for the tenant")
	// ErrUnavailable: the session store cannot be reached or refused the write.
	ErrUnavailable = errors.New("session store unavailable")
)

// EndedError says how the session ended; it matches ErrEnded.
type EndedError struct {
	State  State
	Reason string
}

func (e *EndedError) Error() string {
	return fmt.Sprintf("session ended (%s: %s)", e.State, e.Reason)
}

// Is makes errors.Is(err, ErrEnded) true.
func (e *EndedError) Is(target error) bool { return target == ErrEnded }

// InvalidError is a request the manager refuses: Field names what is wrong.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
