package provider

import (
	"reflect"
	"testing"
)

func TestAssembleToolCalls(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		deltas []ToolCallDelta
		want   []ToolCall
	}{
		{name: "none"},
		{
			name: "two calls interleaved",
			deltas: []ToolCallDelta{
				{Index: 0, ID: "a", Type: "function", Name: "f"},
				{Index: 0, Arguments: `{"x":`},
				{Index: 1, ID: "b", Type: "function", Name: "g", Arguments: `{}`},
				{Index: 0, Arguments: `1}`},
			},
			want: []ToolCall{{ID: "a", Type: "function", Name: "f", Arguments: `{"x":1}`}, {ID: "b", Type: "function", Name: "g", Arguments: `{}`}},
		},
		{
			// An index that skips ahead or is negative is appended, never dropped.
			name:   "out of range index",
			deltas: []ToolCallDelta{{Index: 5, ID: "a", Name: "f"}, {Index: -1, ID: "b", Name: "g"}},
			want:   []ToolCall{{ID: "a", Name: "f"}, {ID: "b", Name: "g"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []ToolCall
			// One delta at a time, as a stream delivers them.
			for _, d := range tt.deltas {
				got = AssembleToolCalls(got, []ToolCallDelta{d})
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("AssembleToolCalls = %+v, want %+v", got, tt.want)
			}
		})
	}
}
