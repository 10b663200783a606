package redisstore

import (
	"testing"
)

// FuzzMessagePackReplies: whatever Redis (or something posing as it) replies, the batch is
// split, each operation's reply read value by value, and the result is values or
// errMalformedReply, never a panic or a read past the end.
func FuzzMessagePackReplies(f *testing.F) {
	one := string(mpArgs(int64(1), "rpm", int64(-70000), 0.25, true))
	f.Add(string(mpArray(nil, 1))+one, uint8(1))
	f.Add(string(mpArray(nil, 2))+one+"\x81\xa3err\xa9WRONGTYPE", uint8(2))
	f.Add("\x91\x82\xa1x\xc3\xa3err\xa3OOM", uint8(1))
	f.Add("\xdd\xff\xff\xff\xff", uint8(3))
	f.Add("\x91\xdb\xff\xff\xff\xff", uint8(1))
	f.Fuzz(func(t *testing.T, b string, n uint8) {
		replies, err := splitReplies(b, int(n%8))
		if err != nil {
			return
		}
		for _, raw := range replies {
			rep := opReply(raw)
			if rep.err != nil {
				continue
			}
			r := newReply(rep.v)
			for i := 0; r.more() && r.err == nil; i++ {
				if i > len(rep.v) {
					t.Fatalf("read %d values from %d bytes", i, len(rep.v))
				}
				if i%2 == 0 {
					r.int()
				} else {
					r.str()
				}
			}
		}
	})
}
