package session

import (
	"context"
	"time"
)

// EventKind says what happened to a session.
type EventKind int

// Event kinds.
const (
	// EventDegraded: a step answered degraded or stale and the session became degraded.
	EventDegraded EventKind = iota + 1
	// EventPendingConfirmation: a step waits for a person to confirm its action.
	EventPendingConfirmation
	// EventEnded: the session ended (State and Reason say how).
	EventEnded
)

// Event is a change of a session that operators watch.
type Event struct {
	Kind              EventKind
	At                time.Time
	Tenant, SessionID string
	// StepID and Target name the step the event is about (empty for EventEnded).
	StepID, Target string
	// State is the session's state after the change.
	State State
	// Reason is the step's reason, or the session's end reason.
	Reason       string
	Degradations int
}

// OnEvent sets fn to be called after every change written to a session that degraded
// it, left a step pending confirmation or ended it, once per change, on the replica that
// wrote it. Call it before the manager serves; fn must not block.
func (m *Manager) OnEvent(fn func(ctx context.Context, ev Event)) { m.onEvent = fn }

// notify reports what the change from before (nil for a new session) to after did.
func (m *Manager) notify(ctx context.Context, before, after *Session) {
	if m.onEvent == nil {
		return
	}
	for _, ev := range eventsOf(before, after) {
		m.onEvent(ctx, ev)
	}
}

// eventsOf lists the events of the change from before (nil for a new session) to after.
func eventsOf(before, after *Session) []Event {
	var out []Event
	base := Event{At: after.UpdatedAt, Tenant: after.Tenant, SessionID: after.ID, State: after.State, Degradations: after.Degradations}
	changed := func(st *Step) bool {
		if before == nil {
			return true
		}
		prev := before.step(st.ID)
		return prev == nil || prev.Status != st.Status || prev.Attempts != st.Attempts
	}
	if after.Degraded && (before == nil || !before.Degraded) {
		ev := base
		ev.Kind = EventDegraded
		for _, st := range after.Steps {
			if (st.Status == StatusDegraded || st.Status == StatusStale) && changed(st) {
				ev.StepID, ev.Target, ev.Reason = st.ID, st.Target, st.Reason
				break
			}
		}
		out = append(out, ev)
	}
	for _, st := range after.Steps {
		if st.Status == StatusPendingConfirmation && changed(st) {
			ev := base
			ev.Kind, ev.StepID, ev.Target, ev.Reason = EventPendingConfirmation, st.ID, st.Target, st.Reason
			out = append(out, ev)
		}
	}
	if !after.active() && (before == nil || before.active()) {
		ev := base
		ev.Kind, ev.Reason = EventEnded, after.EndReason
		out = append(out, ev)
	}
	return out
}
