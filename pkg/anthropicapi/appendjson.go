package anthropicapi

import (
	"strconv"

	"github.com/mantle-mesh/mantle/pkg/jsonwrite"
)

// AppendJSON appends d as json.Marshal writes it, byte for byte, without reflection: a
// streamed answer sends one per piece of text or tool input (FuzzBlockDeltaJSON holds it
// to json.Marshal).
func (d *BlockDelta) AppendJSON(b []byte) []byte {
	b = append(b, `{"type":`...)
	b = jsonwrite.String(b, d.Type)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(d.Index), 10)
	b = append(b, `,"delta":{"type":`...)
	b = jsonwrite.String(b, d.Delta.Type)
	if d.Delta.Text != nil {
		b = append(b, `,"text":`...)
		b = jsonwrite.String(b, *d.Delta.Text)
	}
	if d.Delta.PartialJSON != nil {
		b = append(b, `,"partial_json":`...)
		b = jsonwrite.String(b, *d.Delta.PartialJSON)
	}
	return append(b, "}}"...)
}
