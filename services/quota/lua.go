package quota

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The quota operations share prelude.lua (arithmetic, clock, bucket helpers); batch.lua
// runs a list of them in one call.
var (
	//go:embed lua/prelude.lua
	luaPrelude string
	//go:embed lua/reserve.lua
	luaReserve string
	//go:embed lua/settle.lua
	luaSettle string
	//go:embed lua/adjust.lua
	luaAdjust string
	//go:embed lua/retry.lua
	luaRetry string
	//go:embed lua/batch.lua
	luaBatch string
)

// Operation names of batch.lua.
const (
	opReserve = "r"
	opSettle  = "s"
	opAdjust  = "a"
	opRetry   = "t"
)

// luaLib is the quota code in the two forms Redis runs it: a function library (Redis
// 7.0 and later), whose helpers are built once when it is loaded, and a script, which
// rebuilds them on every EVALSHA, for servers without functions.
//
// The library's name carries a hash of its code, which versions it: replicas running
// different builds (a rolling deploy) each load and call their own library, and REPLACE
// only ever replaces a library with the same code.
type luaLib struct {
	name   string // library and function name
	code   string // FUNCTION LOAD's argument
	script *redis.Script
	src    string // the script's body, for EVAL
}

// quotaLib is the library every RedisStore uses.
var quotaLib = newLuaLib("")

// newLuaLib assembles the library; extra is Lua code added to it (tests use a comment
// to get a library no Redis has seen yet).
func newLuaLib(extra string) *luaLib {
	var b strings.Builder
	b.WriteString(extra)
	b.WriteString("\n")
	b.WriteString(luaPrelude)
	for _, op := range []struct{ name, body string }{
		{"op_reserve", luaReserve}, {"op_settle", luaSettle}, {"op_adjust", luaAdjust}, {"op_retry", luaRetry},
	} {
		// Each operation file is the body of a function of (KEYS, ARGV), as it would be
		// a script's.
		b.WriteString("\nlocal function " + op.name + "(KEYS, ARGV)\n")
		b.WriteString(op.body)
		b.WriteString("\nend\n")
	}
	b.WriteString(luaBatch)
	body := b.String()
	sum := sha1.Sum([]byte(body))
	name := "mantle_quota_" + hex.EncodeToString(sum[:8])
	src := body + "\nreturn batch(KEYS, ARGV)\n"
	return &luaLib{
		name:   name,
		code:   "#!lua name=" + name + "\n" + body + "\nredis.register_function('" + name + "', batch)\n",
		script: redis.NewScript(src),
		src:    src,
	}
}

// command is the FCALL (or EVALSHA, or EVAL) that runs calls in order, in batch.lua's
// layout: every call's keys, then per call its operation, key count, argument count
// and arguments. It is built whole, as go-redis sends it, to copy the arguments once.
func (l *luaLib) command(mode sendMode, calls []*scriptCall) []any {
	nkeys, nargs := 0, 0
	for _, c := range calls {
		nkeys += len(c.keys)
		nargs += 3 + len(c.args)
	}
	a := make([]any, 0, 3+nkeys+nargs)
	switch mode {
	case sendFunction:
		a = append(a, "fcall", l.name)
	case sendScript:
		a = append(a, "evalsha", l.script.Hash())
	default:
		a = append(a, "eval", l.src)
	}
	a = append(a, nkeys)
	for _, c := range calls {
		for _, k := range c.keys {
			a = append(a, k)
		}
	}
	for _, c := range calls {
		a = append(a, c.op, len(c.keys), len(c.args))
		a = append(a, c.args...)
	}
	return a
}

// opArgs is one operation's arguments for batch.lua as a script of its own: the
// operation's header, then args.
func opArgs(op string, keys []string, args []any) []any {
	a := make([]any, 0, 3+len(args))
	a = append(a, op, len(keys), len(args))
	return append(a, args...)
}
