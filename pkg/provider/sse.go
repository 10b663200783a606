package provider

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// Event is one server-sent event.
type Event struct {
	// Name is the event's "event:" field; empty for unnamed events (all of OpenAI's).
	Name string
	// Data is the event's "data:" lines joined by newlines.
	Data string
}

// maxEventLine bounds one line of an event stream, and the data of one event (its data
// lines together), so a misbehaving server cannot make the reader buffer without limit.
const maxEventLine = 4 << 20

// EventReader reads a text/event-stream body, the framing both OpenAI-compatible servers
// and Anthropic use for streaming. It lives here, not in each adapter, because telling a
// clean end from a cut connection is the same problem for both.
type EventReader struct {
	r *bufio.Reader
}

// NewEventReader returns a reader of the events in r.
func NewEventReader(r io.Reader) *EventReader {
	return &EventReader{r: bufio.NewReader(r)}
}

// Next returns the next event that carries data. Comments (": keep-alive"), id and retry
// fields, and events without data are skipped, as the SSE specification says.
//
// Next returns io.EOF when the stream ended between lines, and io.ErrUnexpectedEOF when it
// ended in the middle of a line, which only a cut connection does. An event whose lines are
// complete but whose terminating blank line never came is still returned: its data is
// whole, so it is better judged by the adapter than dropped. A line, or an event's data,
// over 4 MiB is a MALFORMED_OUTPUT *Error; any other error is the underlying read error.
func (er *EventReader) Next() (Event, error) {
	var (
		ev   Event
		data []string
		size int // of data, joined
	)
	for {
		line, err := er.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && len(data) > 0 {
				ev.Data = strings.Join(data, "\n")
				return ev, nil
			}
			return Event{}, err
		}
		if line == "" {
			if len(data) > 0 {
				ev.Data = strings.Join(data, "\n")
				return ev, nil
			}
			ev = Event{}
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			ev.Name = value
		case "data":
			if size += len(value) + 1; size > maxEventLine+1 {
				return Event{}, &Error{
					Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
					Message: fmt.Sprintf("event stream event with more than %d bytes of data", maxEventLine),
				}
			}
			data = append(data, value)
		}
	}
}

// Ready reports whether the next call of Next returns an event without reading from the
// underlying reader: a whole event that carries data (its lines and the blank line that
// ends it) is already buffered, after nothing but whole events without data, which Next
// skips. A stream whose events arrive together can so tell that more follows at once.
func (er *EventReader) Ready() bool {
	buf, _ := er.r.Peek(er.r.Buffered()) // never more than is buffered: no read
	data := false
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			return false
		}
		line := buf[:i]
		buf = buf[i+1:]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		switch {
		case len(line) == 0:
			if data {
				return true
			}
		case bytes.HasPrefix(line, []byte("data:")) || string(line) == "data":
			data = true
		}
	}
}

// readLine returns one line without its terminator (\n or \r\n).
func (er *EventReader) readLine() (string, error) {
	var line []byte
	for {
		frag, err := er.r.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > maxEventLine {
			return "", &Error{
				Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
				Message: fmt.Sprintf("event stream line longer than %d bytes", maxEventLine),
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return "", io.ErrUnexpectedEOF
		case err != nil:
			return "", err
		}
		line = line[:len(line)-1]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		return string(line), nil
	}
}
