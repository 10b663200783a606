package httpbody

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

func TestRead(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("0123456789", 10_000)
	tests := []struct {
		name     string
		body     string
		declared int64
		limit    int64
		wantCap  int // the buffer's capacity when it is sized from declared; 0: not checked
	}{
		{"empty", "", 0, 100, 1},
		{"declared", "hello", 5, 100, 5 + 1},
		{"long, declared", long, int64(len(long)), 1 << 20, len(long) + 1},
		// A declared length much longer than what comes sets aside no more than the first
		// buffer: memory follows the bytes sent.
		{"declared far over what comes", "hello", 1 << 20, 1 << 20, firstBuffer + 1},
		{"unknown length", long, -1, 1 << 20, 0},
		{"declared over the limit: not trusted", "short", 1 << 40, 100, 0},
		// A declared length shorter than the body (r bounds the read, not declared).
		{"declared too short", long, 10, 1 << 20, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := read(iotest.HalfReader(strings.NewReader(tt.body)), tt.declared, tt.limit)
			if err != nil || string(got) != tt.body {
				t.Fatalf("read = %d bytes, %v; want the %d bytes of the body", len(got), err, len(tt.body))
			}
			if tt.wantCap > 0 && cap(got) != tt.wantCap {
				t.Errorf("buffer of %d bytes, want %d (one buffer sized from the declared length)", cap(got), tt.wantCap)
			}
		})
	}
}

// A reader's error comes back, with what was read before it.
func TestReadReturnsTheReadersError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, declared := range []int64{-1, 10} {
		got, err := read(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), declared, 100)
		if !errors.Is(err, boom) || string(got) != "abc" {
			t.Errorf("declared %d: read = %q, %v; want \"abc\" and the reader's error", declared, got, err)
		}
	}
}

// A request body over the limit is refused with *http.MaxBytesError whether or not its
// length was declared.
func TestRequestOverLimit(t *testing.T) {
	t.Parallel()
	for _, declare := range []bool{true, false} {
		body := strings.Repeat("x", 200)
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		if !declare {
			req.ContentLength = -1
		}
		_, err := Request(httptest.NewRecorder(), req, 100)
		var tooBig *http.MaxBytesError
		if !errors.As(err, &tooBig) {
			t.Errorf("declared %v: Request over the limit = %v, want *http.MaxBytesError", declare, err)
		}
	}
}

// Response stops at n bytes, whatever length the answer declared.
func TestResponseStopsAtN(t *testing.T) {
	t.Parallel()
	for _, declared := range []int64{-1, 3, 6, 1 << 30} {
		resp := &http.Response{Body: io.NopCloser(strings.NewReader("abcdef")), ContentLength: declared}
		if got, err := Response(resp, 4); err != nil || string(got) != "abcd" {
			t.Errorf("declared %d: Response(n=4) = %q, %v; want \"abcd\"", declared, got, err)
		}
	}
}

// BenchmarkRead compares Read with io.ReadAll on bodies of a chat request's sizes: a
// question, a conversation, an agent's long context.
func BenchmarkRead(b *testing.B) {
	for _, size := range []int{600, 20 << 10, 200 << 10} {
		body := bytes.Repeat([]byte("a"), size)
		for _, tc := range []struct {
			name string
			read func(io.Reader) ([]byte, error)
		}{
			{"ReadAll", io.ReadAll},
			{"read", func(r io.Reader) ([]byte, error) { return read(r, int64(size), 1<<20) }},
		} {
			b.Run(fmt.Sprintf("%s/%dB", tc.name, size), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(size))
				for b.Loop() {
					if _, err := tc.read(bytes.NewReader(body)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// FuzzRead: whatever the body and whatever length it declared (true, short, long, absent or
// over the limit), read gives back exactly the body's bytes.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[]}`), int64(27))
	f.Add([]byte("body"), int64(-1))
	f.Add([]byte("longer than declared"), int64(3))
	f.Add([]byte("short"), int64(1<<16+100))
	f.Add(bytes.Repeat([]byte("x"), 1<<16+3), int64(1<<16+3))
	f.Fuzz(func(t *testing.T, body []byte, declared int64) {
		const limit = 1 << 20
		got, err := read(iotest.HalfReader(bytes.NewReader(body)), max(declared, -1), limit)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("read(%d bytes, declared %d) = %d bytes, %v", len(body), declared, len(got), err)
		}
	})
}
