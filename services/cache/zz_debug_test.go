package cache

import (
	"context"
	"fmt"
	"testing"

	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
	"github.com/mantle-mesh/mantle/services/cache/internal/nearmiss"
	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

func TestZZDebugEval(t *testing.T) {
	e := embed.NewLexical()
	for _, p := range loadEvalSet(t) {
		a, _ := e.Embed(context.Background(), foldText(p.Stored))
		b, _ := e.Embed(context.Background(), foldText(p.Query))
		s := vector.Dot(a, b)
		r, _ := nearmiss.Compare(p.Stored, p.Query)
		if (p.Hit && s >= 0.8) || (!p.Hit && s >= 0.8 && p.Tenant != "other") || (p.Hit && r != "") {
			fmt.Printf("%v %-10s %.3f guard=%-8s %s | %s\n", p.Hit, p.Kind, s, r, p.Stored, p.Query)
		}
	}
}
