package provider

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

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
	// data gathers an event's data lines, joined; kept from one event to the next, so that
	// an event costs one allocation, its Data.
	data []byte
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
		ev    Event
		lines int // data lines of the event so far
	)
	if cap(er.data) > maxKeptData {
		er.data = nil // a rare long event's buffer is not kept for the stream's life
	}
	er.data = er.data[:0]
	for {
		line, err := er.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && lines > 0 {
				ev.Data = string(er.data)
				return ev, nil
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if lines > 0 {
				ev.Data = string(er.data)
				return ev, nil
			}
			ev = Event{}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			ev.Name = string(value)
		case "data":
			joined := len(er.data) + len(value)
			if lines > 0 {
				joined++ // the newline between lines
			}
			if joined > maxEventLine {
				return Event{}, &Error{
					Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
					Message: fmt.Sprintf("event stream event with more than %d bytes of data", maxEventLine),
				}
			}
			if lines > 0 {
				er.data = append(er.data, '\n')
			}
			er.data = append(er.data, value...)
			lines++
		}
	}
}

// maxKeptData is the largest data buffer an EventReader keeps between events.
const maxKeptData = 64 << 10

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

// readLine returns one line without its terminator (\n or \r\n), valid until the next
// read: most lines are a view of the reader's buffer, copied nowhere.
func (er *EventReader) readLine() ([]byte, error) {
	line, err := er.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		// Longer than the reader's buffer: gathered, up to the limit.
		long := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) && len(long) <= maxEventLine {
			line, err = er.r.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	if len(line) > maxEventLine {
		return nil, &Error{
			Class:   mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT,
			Message: fmt.Sprintf("event stream line longer than %d bytes", maxEventLine),
		}
	}
	switch {
	case errors.Is(err, io.EOF) && len(line) > 0:
		return nil, io.ErrUnexpectedEOF
	case err != nil:
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}
