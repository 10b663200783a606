package provider

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzEventReader: any byte stream yields the events refEvents reads in it and then io.EOF,
// io.ErrUnexpectedEOF or a MALFORMED_OUTPUT *Error; it never loops or panics.
func FuzzEventReader(f *testing.F) {
	for _, seed := range []string{
		"data: {\"a\":1}\n\ndata: [DONE]\n\n",
		"event: message_start\r\ndata: {}\r\n\r\n: keep-alive\n\nid: 3\nretry: 10\ndata: x\ndata: y\n",
		"data: cut in the midd",
		"\n\n\n", ":only a comment\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		// Delivered in reads of a size the input picks, so that events fall across reads.
		src := &countingReader{r: bytes.NewReader(stream), max: 1 + len(stream)%61}
		er := NewEventReader(src)
		wantEvents, wantEnd := refEvents(string(stream))
		var got []Event
		for i := 0; ; i++ {
			ready, reads := er.Ready(), src.reads
			ev, err := er.Next()
			if ready && (err != nil || src.reads != reads) {
				t.Fatalf("Ready, then Next read %d times and returned %+v, %v", src.reads-reads, ev, err)
			}
			if err != nil {
				var perr *Error
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &perr) {
					t.Fatalf("Next: %v", err)
				}
				if perr == nil && (!errors.Is(err, wantEnd) || !slices.Equal(got, wantEvents)) {
					t.Fatalf("events %q, end %v; want %q, %v", got, err, wantEvents, wantEnd)
				}
				return
			}
			got = append(got, ev)
			if ev.Data == "" && !strings.Contains(string(stream), "data") {
				t.Fatalf("event %+v from a stream without data", ev)
			}
			if i > len(stream) {
				t.Fatalf("more events (%d) than bytes (%d)", i, len(stream))
			}
		}
	})
}

// refEvents reads stream as the SSE specification says, the whole input at once: the
// reference Next must match (within its size bounds, which fuzzed inputs stay under).
func refEvents(stream string) ([]Event, error) {
	var (
		out  []Event
		ev   Event
		data []string
	)
	for {
		i := strings.IndexByte(stream, '\n')
		if i < 0 {
			if stream != "" {
				return out, io.ErrUnexpectedEOF // cut in the middle of a line
			}
			if len(data) > 0 {
				out = append(out, Event{Name: ev.Name, Data: strings.Join(data, "\n")})
			}
			return out, io.EOF
		}
		line := strings.TrimSuffix(stream[:i], "\r")
		stream = stream[i+1:]
		switch field, value, _ := strings.Cut(line, ":"); {
		case line == "":
			if len(data) > 0 {
				out = append(out, Event{Name: ev.Name, Data: strings.Join(data, "\n")})
			}
			ev, data = Event{}, nil
		case strings.HasPrefix(line, ":"):
		case field == "event":
			ev.Name = strings.TrimPrefix(value, " ")
		case field == "data":
			data = append(data, strings.TrimPrefix(value, " "))
		}
	}
}

// FuzzClassifyHTTP: any provider error answer (status, headers, body) is classified, and
// the retry hints it reads are never negative nor beyond a day.
func FuzzClassifyHTTP(f *testing.F) {
	f.Add(429, "20", "1.5s", "100", `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)
	f.Add(400, "", "", "", `{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}`)
	f.Add(529, "Wed, 21 Oct 2015 07:28:00 GMT", "6m0s", "-1", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	f.Add(500, "abc", "1h2m3.5s", "9999999999999999999999", `<html>bad gateway</html>`)
	f.Add(200, "1e9", "2026-12-01T00:00:00Z", "0", `{"error":{"code":123}}`)
	f.Add(429, "1e300", "9999999h", "0", `{}`)
	f.Add(503, "NaN", "+Inf", "1", `{}`)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	f.Fuzz(func(t *testing.T, status int, retryAfter, reset, remaining, body string) {
		h := http.Header{}
		h.Set("Retry-After", retryAfter)
		h.Set("retry-after-ms", retryAfter)
		h.Set("x-ratelimit-reset-requests", reset)
		h.Set("x-ratelimit-reset-tokens", reset)
		h.Set("x-ratelimit-remaining-requests", remaining)
		h.Set("x-ratelimit-remaining-tokens", remaining)
		h.Set("anthropic-ratelimit-requests-reset", reset)
		h.Set("anthropic-ratelimit-requests-remaining", remaining)
		if e := ClassifyHTTP(status, h, []byte(body), clock); e != nil && (e.RetryAfter < 0 || e.RetryAfter > maxRetryHint) {
			t.Fatalf("RetryAfter %v outside [0, %v]", e.RetryAfter, maxRetryHint)
		}
		if d := RetryAfter(h, clock); d < 0 || d > maxRetryHint {
			t.Fatalf("RetryAfter(h) = %v", d)
		}
		if rl := ParseRateLimit(h, clock); rl.ResetRequests < 0 || rl.ResetTokens < 0 || rl.ResetRequests > maxRetryHint || rl.ResetTokens > maxRetryHint || rl.RemainingRequests < -1 || rl.RemainingTokens < -1 {
			t.Fatalf("ParseRateLimit = %+v", rl)
		}
		_, _ = ParseAPIError([]byte(body))
	})
}

// countingReader reads at most max bytes at a time from r and counts its reads.
type countingReader struct {
	r     io.Reader
	max   int
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p[:min(len(p), c.max)])
}
