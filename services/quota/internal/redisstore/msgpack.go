package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The quota operations' arguments travel to Redis as MessagePack, one blob per call,
// which Redis's Lua decodes with cmsgpack.unpack (in every Redis since 2.6, scripts and
// functions alike). As plain command arguments each operation was about twenty
// strings: go-redis formats every number, Redis makes an object and then a Lua string
// of each, and the script parses the numbers back with tonumber (strtod). Decoded from
// MessagePack in C, numbers arrive as Lua numbers and an operation's arguments as one
// table.
//
// Only what the operations need is written here: arrays, integers, doubles, strings and
// booleans. Lua numbers are doubles, so integers are exact below 2^53, as they were
// when Lua parsed them from decimal strings (and larger ones round the same way).

func mpArray(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
	}
}

func mpInt(b []byte, v int64) []byte {
	switch {
	case v >= 0 && v < 128:
		return append(b, byte(v))
	case v < 0 && v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
	}
}

func mpFloat(b []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(v))
}

func mpString(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func mpBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

// mpArgs encodes an operation's arguments given as values, for tests and the few calls
// off the hot path; a nil is written as false.
func mpArgs(args ...any) []byte {
	b := mpArray(make([]byte, 0, 16*len(args)), len(args))
	for _, a := range args {
		switch v := a.(type) {
		case nil:
			b = mpBool(b, false)
		case bool:
			b = mpBool(b, v)
		case int:
			b = mpInt(b, int64(v))
		case int64:
			b = mpInt(b, v)
		case float64:
			b = mpFloat(b, v)
		case string:
			b = mpString(b, v)
		default:
			panic(fmt.Sprintf("quota: mpArgs cannot encode a %T", a)) //nolint:forbidigo // callers pass fixed types; a new one is a programming error
		}
	}
	return b
}

// Replies come back the same way: batch.lua packs the list of the operations' replies
// with cmsgpack.pack, which Redis sends as one string, so that go-redis reads one value
// per batch instead of boxing every number of every reply. An operation's reply is an
// array of integers and strings, or a map {err = message} when it failed.

// ErrMalformedReply is a reply that is not the MessagePack batch.lua writes.
var ErrMalformedReply = errors.New("redis: malformed quota reply")

// opError is an operation's error reply. It is a go-redis Error, so that
// redis.HasErrorPrefix reads it as it reads Redis's own.
type opError string

func (e opError) Error() string { return string(e) }
func (opError) RedisError()     {}

// mpHeader reads the header of the value at b[i:]: its kind, its length (elements of an
// array or map, bytes of a string) or value (an integer, a float's bits), and the offset
// of what follows the header.
type mpKind int

const (
	mpBad mpKind = iota
	mpNil
	mpBoolean
	mpInteger // v is the value, as a uint64 of an int64
	mpUint    // v is the value
	mpFloat32 // v is the bits
	mpFloat64 // v is the bits
	mpStr     // v is the length
	mpArr     // v is the element count
	mpMap     // v is the pair count
)

func mpHeader(b string, i int) (kind mpKind, v uint64, next int) {
	if i < 0 || i >= len(b) {
		return mpBad, 0, i
	}
	c := b[i]
	i++
	// need returns the n bytes after the type byte as a big-endian number.
	need := func(n int) (uint64, bool) {
		if i+n > len(b) {
			return 0, false
		}
		var x uint64
		for _, ch := range []byte(b[i : i+n]) {
			x = x<<8 | uint64(ch)
		}
		i += n
		return x, true
	}
	var ok bool
	switch {
	case c <= 0x7f:
		return mpInteger, uint64(c), i
	case c >= 0xe0:
		return mpInteger, uint64(int64(int8(c))), i
	case c&0xf0 == 0x90:
		return mpArr, uint64(c & 0x0f), i
	case c&0xf0 == 0x80:
		return mpMap, uint64(c & 0x0f), i
	case c&0xe0 == 0xa0:
		return mpStr, uint64(c & 0x1f), i
	}
	switch c {
	case 0xc0:
		return mpNil, 0, i
	case 0xc2, 0xc3:
		return mpBoolean, uint64(c & 1), i
	case 0xcc, 0xcd, 0xce, 0xcf:
		v, ok = need(1 << (c - 0xcc))
		kind = mpUint
	case 0xd0:
		v, ok = need(1)
		v, kind = uint64(int64(int8(v))), mpInteger
	case 0xd1:
		v, ok = need(2)
		v, kind = uint64(int64(int16(v))), mpInteger
	case 0xd2:
		v, ok = need(4)
		v, kind = uint64(int64(int32(v))), mpInteger
	case 0xd3:
		v, ok = need(8)
		kind = mpInteger
	case 0xca:
		v, ok = need(4)
		kind = mpFloat32
	case 0xcb:
		v, ok = need(8)
		kind = mpFloat64
	case 0xd9, 0xc4:
		v, ok = need(1)
		kind = mpStr
	case 0xda, 0xc5:
		v, ok = need(2)
		kind = mpStr
	case 0xdb, 0xc6:
		v, ok = need(4)
		kind = mpStr
	case 0xdc:
		v, ok = need(2)
		kind = mpArr
	case 0xdd:
		v, ok = need(4)
		kind = mpArr
	case 0xde:
		v, ok = need(2)
		kind = mpMap
	case 0xdf:
		v, ok = need(4)
		kind = mpMap
	default:
		return mpBad, 0, i
	}
	if !ok {
		return mpBad, 0, i
	}
	return kind, v, i
}

// mpSkip returns the offset after the value at b[i:], or -1 when it is malformed.
func mpSkip(b string, i int) int {
	kind, v, next := mpHeader(b, i)
	switch kind {
	case mpBad:
		return -1
	case mpStr:
		if v > uint64(len(b)-next) {
			return -1
		}
		return next + int(v)
	case mpArr, mpMap:
		n := v
		if kind == mpMap {
			n *= 2
		}
		for ; n > 0 && next >= 0; n-- {
			next = mpSkip(b, next)
		}
		return next
	default:
		return next
	}
}

// splitReplies splits batch.lua's reply into the replies of its n operations.
func splitReplies(b string, n int) ([]string, error) {
	kind, count, i := mpHeader(b, 0)
	if kind != mpArr {
		return nil, ErrMalformedReply
	}
	if count != uint64(n) {
		return nil, fmt.Errorf("redis: quota batch of %d operations replied %d", n, count)
	}
	out := make([]string, n)
	for k := range out {
		end := mpSkip(b, i)
		if end < 0 {
			return nil, ErrMalformedReply
		}
		out[k], i = b[i:end], end
	}
	return out, nil
}

// opReply is one operation's reply: the reply, or its error.
func opReply(b string) scriptReply {
	kind, n, i := mpHeader(b, 0)
	switch kind {
	case mpArr:
		return scriptReply{v: b}
	case mpMap:
		// The "err" pair, wherever it is; other pairs are skipped.
		for ; n > 0 && i >= 0; n-- {
			kk, kl, ki := mpHeader(b, i)
			if kk == mpStr && kl <= uint64(len(b)-ki) && b[ki:ki+int(kl)] == "err" {
				vk, vl, vi := mpHeader(b, ki+int(kl))
				if vk == mpStr && vl <= uint64(len(b)-vi) {
					return scriptReply{err: opError(b[vi : vi+int(vl)])}
				}
				break
			}
			i = mpSkip(b, mpSkip(b, i)) // the key, then its value
		}
	}
	return scriptReply{err: ErrMalformedReply}
}
