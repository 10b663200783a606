package agent

import "testing"

func TestResultJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{`{"order":"o-1"}`, `{"order":"o-1"}`},
		{`"done"`, `"done"`},
		{"42", "42"},
		{"charged 12 EUR, ref 7781", `"charged 12 EUR, ref 7781"`},
		{`{"broken":`, `"{\"broken\":"`},
	} {
		if got := resultJSON(tc.in); got != tc.want {
			t.Errorf("resultJSON(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
