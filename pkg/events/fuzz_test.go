package events

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeSpoolRecord: any bytes found on disk decode to a record or errBadRecord, and a
// record that decodes encodes back to the same bytes.
func FuzzDecodeSpoolRecord(f *testing.F) {
	f.Add(encodeSpoolRecord(rec(1)))
	f.Add(encodeSpoolRecord(SpoolRecord{Subject: "mantle.review.requests", MsgID: "", Data: nil}))
	f.Add(encodeSpoolRecord(SpoolRecord{Subject: "s", MsgID: "id", Data: bytes.Repeat([]byte{0xff}, 300)}))
	f.Add([]byte("MSP\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := decodeSpoolRecord(raw)
		if err != nil {
			if !errors.Is(err, errBadRecord) {
				t.Fatalf("error %v, want errBadRecord", err)
			}
			return
		}
		if again := encodeSpoolRecord(r); !bytes.Equal(again, raw) {
			t.Fatalf("decoded %+v re-encodes to %x, not %x", r, again, raw)
		}
	})
}
