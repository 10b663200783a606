package tokencount

import (
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

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
