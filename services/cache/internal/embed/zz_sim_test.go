package embed

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

func TestZZSim(t *testing.T) {
	f, err := os.Open("/tmp/simtool/pairs.txt")
	if err != nil {
		t.Skip()
	}
	sc := bufio.NewScanner(f)
	e := NewLexical()
	for sc.Scan() {
		parts := strings.Split(sc.Text(), "|")
		if len(parts) != 2 {
			continue
		}
		a, _ := e.Embed(context.Background(), parts[0])
		b, _ := e.Embed(context.Background(), parts[1])
		fmt.Printf("%.3f  %s | %s\n", vector.Dot(a, b), parts[0], parts[1])
	}
}
