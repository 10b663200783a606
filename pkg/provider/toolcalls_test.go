package provider

import (
	"reflect"
	"strings"
	"testing"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

func TestToolCallAssembler(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		deltas []ToolCallDelta
		want   []ToolCall
		bytes  int // of every piece taken
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
			want:  []ToolCall{{ID: "a", Type: "function", Name: "f", Arguments: `{"x":1}`}, {ID: "b", Type: "function", Name: "g", Arguments: `{}`}},
			bytes: 2 + 2*len("function") + 2 + len(`{"x":1}{}`), // ids, types, names, arguments
		},
		{
			name:   "a name in pieces",
			deltas: []ToolCallDelta{{Index: 0, ID: "a", Name: "get_"}, {Index: 0, Name: "weather", Arguments: "{}"}},
			want:   []ToolCall{{ID: "a", Name: "get_weather", Arguments: "{}"}},
			bytes:  len("aget_weather{}"),
		},
		{
			// An index that skips ahead or is negative is appended, never dropped.
			name:   "out of range index",
			deltas: []ToolCallDelta{{Index: 5, ID: "a", Name: "f"}, {Index: -1, ID: "b", Name: "g"}},
			want:   []ToolCall{{ID: "a", Name: "f"}, {ID: "b", Name: "g"}},
			bytes:  4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var a ToolCallAssembler
			// One delta at a time, as a stream delivers them, reading the calls between.
			for _, d := range tt.deltas {
				if err := a.Add([]ToolCallDelta{d}); err != nil {
					t.Fatalf("Add(%+v): %v", d, err)
				}
				_ = a.Calls()
			}
			if got := a.Calls(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Calls() = %+v, want %+v", got, tt.want)
			}
			if a.Bytes() != tt.bytes {
				t.Errorf("Bytes() = %d, want %d", a.Bytes(), tt.bytes)
			}
		})
	}
}

// TestToolCallAssemblerBound: a stream may begin MaxStreamedToolCalls calls and no more;
// pieces of calls already begun are still taken.
func TestToolCallAssemblerBound(t *testing.T) {
	t.Parallel()
	var a ToolCallAssembler
	for i := range MaxStreamedToolCalls {
		if err := a.Add([]ToolCallDelta{{Index: i, ID: "c", Arguments: "{"}}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if err := a.Add([]ToolCallDelta{{Index: 0, Arguments: "}"}}); err != nil {
		t.Fatalf("a piece of call 0: %v", err)
	}
	err := a.Add([]ToolCallDelta{{Index: MaxStreamedToolCalls, ID: "one too many"}})
	if err == nil || err.Class != mantlev1.ErrorClass_ERROR_CLASS_MALFORMED_OUTPUT || !strings.Contains(err.Message, "more than 1024 tool calls") {
		t.Fatalf("call %d: %v, want malformed output", MaxStreamedToolCalls, err)
	}
	if calls := a.Calls(); len(calls) != MaxStreamedToolCalls || calls[0].Arguments != "{}" {
		t.Errorf("after the refusal: %d calls, the first %q", len(calls), calls[0].Arguments)
	}
}

// BenchmarkToolCallAssembler: a tool call's 32 KB of arguments streamed in 8-byte pieces,
// as a model writing a file into a tool call sends them.
//
//	go test -run '^$' -bench BenchmarkToolCallAssembler ./pkg/provider/
func BenchmarkToolCallAssembler(b *testing.B) {
	args := strings.Repeat(`"a row",`, 4096)
	b.SetBytes(int64(len(args)))
	b.ReportAllocs()
	for b.Loop() {
		var a ToolCallAssembler
		for i := 0; i < len(args); i += 8 {
			if err := a.Add([]ToolCallDelta{{Index: 0, Arguments: args[i:min(i+8, len(args))]}}); err != nil {
				b.Fatal(err)
			}
		}
		if len(a.Calls()[0].Arguments) != len(args) {
			b.Fatal("arguments lost")
		}
	}
}
