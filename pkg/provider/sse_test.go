package provider

import (
	"errors"
	"io"
	"strings"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

func readAll(t *testing.T, input string) ([]Event, error) {
	t.Helper()
	r := NewEventReader(strings.NewReader(input))
	var events []Event
	for {
		ev, err := r.Next()
		if err != nil {
			return events, err
		}
		events = append(events, ev)
	}
}

func TestEventReader(t *testing.T) {
	tests := []struct {
		name   string
		input  string
		events []Event
		err    error
	}{
		{
			name:   "openai style",
			input:  "data: {\"a\":1}\n\ndata: [DONE]\n\n",
			events: []Event{{Data: `{"a":1}`}, {Data: "[DONE]"}},
			err:    io.EOF,
		},
		{
			name:   "named events, comments, crlf, no space after colon",
			input:  ": keep-alive\r\nevent: ping\r\ndata:{}\r\n\r\nid: 7\nretry: 10\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			events: []Event{{Name: "ping", Data: "{}"}, {Name: "message_stop", Data: `{"type":"message_stop"}`}},
			err:    io.EOF,
		},
		{
			name:   "multi-line data",
			input:  "data: line one\ndata: line two\n\n",
			events: []Event{{Data: "line one\nline two"}},
			err:    io.EOF,
		},
		{
			name:   "event without data is skipped and forgets its name",
			input:  "event: lonely\n\ndata: x\n\n",
			events: []Event{{Data: "x"}},
			err:    io.EOF,
		},
		{
			name:   "complete last event without blank line is kept",
			input:  "data: a\n\ndata: b\n",
			events: []Event{{Data: "a"}, {Data: "b"}},
			err:    io.EOF,
		},
		{
			name:   "line cut in the middle",
			input:  "data: a\n\ndata: {\"choi",
			events: []Event{{Data: "a"}},
			err:    io.ErrUnexpectedEOF,
		},
		{name: "empty", input: "", err: io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events, err := readAll(t, tt.input)
			if !errors.Is(err, tt.err) {
				t.Errorf("err = %v, want %v", err, tt.err)
			}
			if len(events) != len(tt.events) {
				t.Fatalf("events = %+v, want %+v", events, tt.events)
			}
			for i := range events {
				if events[i] != tt.events[i] {
					t.Errorf("event %d = %+v, want %+v", i, events[i], tt.events[i])
				}
			}
		})
	}
}

func TestEventReaderRejectsHugeLines(t *testing.T) {
	t.Parallel()
	line := strings.Repeat("x", maxEventLine/4)
	tests := []struct {
		name, input string
		want        string // in the error; "" for none
	}{
		{"a line", "data: " + strings.Repeat("x", maxEventLine+1) + "\n\n", "line longer than"},
		// Lines within the bound that add up past it: the event's data is bounded too.
		{"an event's data lines", strings.Repeat("data: "+line+"\n", 5) + "\n", "more than 4194304 bytes of data"},
		{"data at the bound", strings.Repeat("data: "+line+"\n", 3) + "data: " + line[3:] + "\n\n", ""},
		{"events each within the bound", strings.Repeat("data: "+line+"\n\n", 5), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			events, err := readAll(t, tt.input)
			if tt.want == "" {
				if !errors.Is(err, io.EOF) || len(events) == 0 {
					t.Fatalf("%d events, err %v, want them all and io.EOF", len(events), err)
				}
				for _, ev := range events {
					if len(ev.Data) > maxEventLine {
						t.Errorf("an event of %d bytes", len(ev.Data))
					}
				}
				return
			}
			if got := ClassOf(err); got != mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("class = %v, want MALFORMED_OUTPUT saying %q (err %v)", got, tt.want, err)
			}
		})
	}
}

// TestEventReaderReady: after the first event, Ready says whether the next is whole in
// the buffer (the stream arrives in one read), skipping whole events without data as Next
// does; a next event cut short, or only events without data, is not ready.
func TestEventReaderReady(t *testing.T) {
	for _, tt := range []struct {
		name, stream string
		want         bool
	}{
		{"next whole", "data: a\n\ndata: b\n\n", true},
		{"next whole, CRLF", "data: a\r\n\r\ndata: b\r\n\r\n", true},
		{"next named", "data: a\n\nevent: delta\ndata: b\n\n", true},
		{"bare data field", "data: a\n\ndata\n\n", true},
		{"after a comment", "data: a\n\n: keep-alive\n\ndata: b\n\n", true},
		{"next without its blank line", "data: a\n\ndata: b\n", false},
		{"next cut", "data: a\n\ndata: b", false},
		{"only an event without data", "data: a\n\nevent: ping\n\n", false},
		{"only a comment", "data: a\n\n: keep-alive\n\n", false},
		{"end of stream", "data: a\n\n", false},
		{"data in a comment", "data: a\n\n: data: b\n\n", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			er := NewEventReader(strings.NewReader(tt.stream))
			if ev, err := er.Next(); err != nil || ev.Data != "a" {
				t.Fatalf("first Next = %+v, %v; want the event a", ev, err)
			}
			if got := er.Ready(); got != tt.want {
				t.Errorf("Ready() = %t, want %t", got, tt.want)
			}
		})
	}
}
