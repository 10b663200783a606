// Package httpbody reads HTTP bodies whole, in as few buffers as the length their message
// declared allows.
//
// io.ReadAll starts at 512 bytes and grows by copying, so a body of a few hundred
// kilobytes (an agent's conversation, a long answer) goes through about twenty buffers. A
// declared length sizes the buffer instead, but only as far as the bytes that have come
// justify: a client that declares megabytes and sends a trickle must not make a server set
// megabytes aside for each of its connections.
package httpbody

import (
	"io"
	"net/http"
)

// firstBuffer is the most read sets aside before any byte has come: no more than the
// read buffers of a few connections.
const firstBuffer = 64 << 10

// growth bounds each later buffer to this many times the bytes read so far, so that
// memory follows what the peer has sent.
const growth = 4

// Request reads r's body whole, at most limit bytes: past them it returns the
// *http.MaxBytesError of http.MaxBytesReader, which also closes the connection after the
// answer.
func Request(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return read(http.MaxBytesReader(w, r.Body, limit), r.ContentLength, limit)
}

// Response reads resp's body to its end or to n bytes, whichever comes first (a caller
// that must tell a body of n bytes from a longer one asks for one more).
func Response(resp *http.Response, n int64) ([]byte, error) {
	return read(io.LimitReader(resp.Body, n), resp.ContentLength, n)
}

// read reads r to its end. declared is the length the message declared (-1 when
// unknown); a declared length over limit is not trusted to size anything, and neither
// bounds the read: r does. The body's bytes are in one buffer when it is at most
// firstBuffer long, in two up to growth times that, and so on.
func read(r io.Reader, declared, limit int64) ([]byte, error) {
	if declared < 0 || declared > limit {
		return io.ReadAll(r)
	}
	// One byte beyond the declared length: the read that finds the end needs room, and a
	// full buffer would grow for it.
	buf := make([]byte, 0, min(declared, firstBuffer)+1)
	for {
		if len(buf) == cap(buf) {
			// Twice as much (512 bytes at least) for bytes beyond the declared length, from
			// a reader that is not a message's body; towards the declared length for a
			// body longer than its first buffer.
			size := max(2*int64(cap(buf)), 512)
			if n := int64(len(buf)); declared > n {
				size = min(declared, growth*n) + 1
			}
			buf = append(make([]byte, 0, size), buf...)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
