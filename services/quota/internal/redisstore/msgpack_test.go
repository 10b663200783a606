package redisstore

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The operations' arguments and replies as Redis's own cmsgpack reads and writes them:
// every integer width and sign, values beyond int64 (floats, which saturate), long
// strings, and an error reply.
func TestMessagePackRoundTripsThroughRedis(t *testing.T) {
	c := newTestRedisClient(t)
	ctx := context.Background()
	long := strings.Repeat("x", 300)
	args := mpArgs(0, 127, 128, -1, -32, -33, 255, 65536, -70000, int64(1)<<40, int64(-1)<<40,
		int64(math.MaxInt64), "", "rpm", long, 0.25, true, false)
	// Echo every argument back, as batch.lua packs replies, plus 2^63 and -2^64, which
	// Lua only has as floats.
	const echo = `local v = cmsgpack.unpack(ARGV[1])
local out = {}
for i = 1, 16 do out[i] = v[i] end
out[17] = 2^63
out[18] = -2^64
out[19] = type(v[17]) .. ',' .. type(v[18]) .. ',' .. tostring(v[16])
return cmsgpack.pack({out, {err = 'WRONGTYPE Operation against a key holding the wrong kind of value'},
  {ignore_error_stats_update = true, err = 'OOM command not allowed'}})`
	packed, err := c.Eval(ctx, echo, nil, args).Text()
	if err != nil {
		t.Fatal(err)
	}
	replies, err := splitReplies(packed, 3)
	if err != nil {
		t.Fatal(err)
	}
	r := newReply(opReply(replies[0]).v)
	for _, want := range []int64{0, 127, 128, -1, -32, -33, 255, 65536, -70000, 1 << 40, -1 << 40, math.MaxInt64} {
		if got := r.int(); got != want {
			t.Errorf("integer: got %d, want %d", got, want)
		}
	}
	for _, want := range []string{"", "rpm", long} {
		if got := r.str(); got != want {
			t.Errorf("string: got %q, want %q", got, want)
		}
	}
	r.int() // 0.25 becomes 0
	if got := r.int(); got != math.MaxInt64 {
		t.Errorf("2^63: got %d, want it saturated", got)
	}
	if got := r.int(); got != math.MinInt64 {
		t.Errorf("-2^64: got %d, want it saturated", got)
	}
	if got := r.str(); got != "boolean,boolean,0.25" {
		t.Errorf("argument types %q", got)
	}
	if r.more() || r.err != nil {
		t.Errorf("after the last value: more %v, err %v", r.more(), r.err)
	}
	r.int()
	if r.err == nil {
		t.Error("reading past the end: no error")
	}

	if err := opReply(replies[1]).err; !redis.HasErrorPrefix(err, "WRONGTYPE") {
		t.Errorf("error reply: %v, want WRONGTYPE", err)
	}
	// An error table as Redis raises it, with a field besides err (packed first or not).
	if err := opReply(replies[2]).err; !redis.HasErrorPrefix(err, "OOM") {
		t.Errorf("error table with other fields: %v, want OOM", err)
	}
	for _, bad := range []string{replies[2][:len(replies[2])-3], "\x81\xa1x\xc3", "\x82\xa1x"} {
		if err := opReply(bad).err; !errors.Is(err, ErrMalformedReply) {
			t.Errorf("opReply(%q) = %v, want errMalformedReply", bad, err)
		}
	}
	if _, err := splitReplies(packed[:len(packed)-1], 3); !errors.Is(err, ErrMalformedReply) {
		t.Errorf("truncated batch reply: %v, want errMalformedReply", err)
	}
	if _, err := splitReplies(packed, 4); err == nil {
		t.Error("a batch reply with fewer replies than operations: no error")
	}
}
