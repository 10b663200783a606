package formatcheck

import "testing"

func TestUnwrapFence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     string
		want   string
		wantOK bool
	}{
		{in: "```json\n{\"a\":1}\n```", want: `{"a":1}`, wantOK: true},
		{in: "  ```JSON\r\n{\"a\":1}\r\n```  \n", want: `{"a":1}`, wantOK: true},
		{in: "```\n[1, 2]\n```", want: `[1, 2]`, wantOK: true},
		{in: "```{\"a\":1}```", want: `{"a":1}`, wantOK: true},
		{in: "```{\n\"a\": 1}\n```", want: "{\n\"a\": 1}", wantOK: true},
		{in: `{"a":1}`},
		{in: "```json\n{}\n```\n```json\n{}\n```"},
		{in: "Here:\n```json\n{}\n```"},
		{in: "`````"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, ok := unwrapFence(tt.in)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("unwrapFence(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}
