package anthropicapi

import (
	"encoding/json"
	"testing"
)

// FuzzBlockDeltaJSON holds BlockDelta.AppendJSON to json.Marshal's bytes: text and
// input_json deltas, either, both or neither piece set, and strings that need escaping.
func FuzzBlockDeltaJSON(f *testing.F) {
	f.Add("content_block_delta", 0, "text_delta", "Parcels take <3> days & more.\n", uint8(1))
	f.Add("", -1, "input_json_delta", `{"city":"Par`, uint8(2))
	f.Add("t\u2028", 7, "\xff", "\x00\"\\\u2029", uint8(3))
	f.Fuzz(func(t *testing.T, typ string, index int, deltaType, piece string, shape uint8) {
		d := BlockDelta{Type: typ, Index: index, Delta: Delta{Type: deltaType}}
		if shape&1 != 0 {
			d.Delta.Text = &piece
		}
		if shape&2 != 0 {
			d.Delta.PartialJSON = &piece
		}
		want, err := json.Marshal(&d)
		if err != nil {
			t.Fatalf("json.Marshal: %v", err)
		}
		if got := d.AppendJSON([]byte("prefix")); string(got) != "prefix"+string(want) {
			t.Fatalf("AppendJSON = %q\njson.Marshal = %q", got, want)
		}
	})
}
