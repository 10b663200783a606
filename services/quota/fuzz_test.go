package quota

import (
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
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

// FuzzImageTokens: any inline image (bytes, or a data: URL as a caller wrote it) costs a
// bounded number of tokens by either provider's rule, without a panic; its header is read
// within maxImageHeaderBytes.
func FuzzImageTokens(f *testing.F) {
	for _, seed := range []string{
		"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x04\x00\x00\x00\x04\x00\x08\x03\x00\x00\x00",
		"GIF89a\x2c\x01\xc8\x00\x00\x00\x00",
		"\xff\xd8\xff\xc0\x00\x11\x08\x01\xf4\x03\xe8\x03\x01\x22\x00",
		"", "not an image",
	} {
		f.Add([]byte(seed), "data:image/png;base64,iVBORw0KGgo=", "auto")
	}
	f.Fuzz(func(t *testing.T, data []byte, url, detail string) {
		for _, img := range []*mantlev1.ImagePart{{Data: data, Detail: detail}, {Url: url, Detail: detail}} {
			for _, fam := range []family{familyO200k, familyClaude} {
				n, _ := imageTokens(fam, img)
				if n < imageBaseTokens && !fam.anthropicImages || n > max(imageUnknownTokens, anthropicImageMaxTokens) || n < 0 {
					t.Fatalf("imageTokens(%v) = %d, out of the rule's range", fam.name, n)
				}
			}
		}
	})
}
