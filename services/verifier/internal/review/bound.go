package review

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
)

// truncatedMarker ends a text boundEvent cut; it says how much of it there was.
const truncatedMarker = "\n[… truncated by mantle: %d of %d bytes shown]"

// boundEvent returns ev, or when it encodes to more than limit bytes a copy whose long
// texts (question, answer, replacement text) are cut, each to a share of the limit, on a
// UTF-8 boundary and with a marker. A reviewer still sees the start of each; the request
// id leads to the rest.
func boundEvent(ev *eventsv1.ReviewRequestEvent, limit int) *eventsv1.ReviewRequestEvent {
	if proto.Size(ev) <= limit {
		return ev
	}
	out := proto.Clone(ev).(*eventsv1.ReviewRequestEvent)
	share := limit / 4 // three texts, and room for everything else
	out.Question = truncateText(out.Question, share)
	out.Content = truncateText(out.Content, share)
	out.DefaultActionText = truncateText(out.DefaultActionText, share)
	if q := out.GetQuality(); q != nil && proto.Size(out) > limit {
		// The audit trail is what remains unbounded: its steps are in the request's record.
		q.Audit = nil
	}
	return out
}

// truncateText cuts s to at most n bytes, marker included.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	keep := max(n-len(truncatedMarker)-20, 0)
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + fmt.Sprintf(truncatedMarker, keep, len(s))
}
