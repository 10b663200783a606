package quota

import (
	"encoding/binary"
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
			panic(fmt.Sprintf("quota: mpArgs cannot encode a %T", a))
		}
	}
	return b
}
