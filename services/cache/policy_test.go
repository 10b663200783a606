package cache

import "testing"

func TestContainsMarker(t *testing.T) {
	t.Parallel()
	p := compilePolicy(Policy{VolatileMarkers: []string{"Now", "today", "in stock", "今天", "库存"}})
	tests := []struct {
		text string
		want bool
	}{
		{"what is the weather now", true},
		{"now?", true},
		{"today's specials", true},
		{"is it in stock", true},
		{"i don't know", false},
		{"nowhere to go", false},
		{"snowfall records", false},
		{"stock in shops", false},
		{"今天天气怎么样", true},
		{"查询库存", true},
		{"how do i reset my password", false},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			t.Parallel()
			if got := p.containsMarker(normalizeText(tt.text)); got != tt.want {
				t.Errorf("containsMarker(%q) = %v, want %v", tt.text, got, tt.want)
			}
		})
	}
}
