package flightredis

import (
	"context"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

// readmeClientOptions returns the redis.Options literal of the README's
// Redis snippet ("Beyond one process"), as printed, and the snippet.
func readmeClientOptions(t *testing.T) (*ast.CompositeLit, string) {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Beyond one process")
	if !ok {
		t.Fatal(`README.md: no section "Beyond one process"`)
	}
	var snippet string
	for part := range strings.SplitSeq(section, "```go\n") {
		if code, _, ok := strings.Cut(part, "```"); ok && strings.Contains(code, "flightredis.NewTier(") {
			snippet = code
			break
		}
	}
	if snippet == "" {
		t.Fatal("README.md: no Go snippet that calls flightredis.NewTier in \"Beyond one process\"")
	}
	_, lit, ok := strings.Cut(snippet, "&redis.Options{")
	if !ok {
		t.Fatalf("README.md: the snippet builds no redis.Options, so rdb is not what NewTier accepts:\n%s", snippet)
	}
	depth, end := 1, -1
	for i, r := range lit {
		switch r {
		case '{':
			depth++
		case '}':
			depth--
		}
		if depth == 0 {
			end = i
			break
		}
	}
	if end < 0 {
		t.Fatalf("README.md: unbalanced redis.Options literal:\n%s", snippet)
	}
	expr, err := parser.ParseExpr("redis.Options{" + lit[:end+1])
	if err != nil {
		t.Fatalf("README.md: the redis.Options literal does not parse: %v", err)
	}
	return expr.(*ast.CompositeLit), snippet
}

// readmeOptions builds the redis.Options the literal lit spells: string,
// bool and integer fields, and durations written as N * time.Unit.
func readmeOptions(t *testing.T, lit *ast.CompositeLit) redis.Options {
	t.Helper()
	var o redis.Options
	v := reflect.ValueOf(&o).Elem()
	units := map[string]time.Duration{"Millisecond": time.Millisecond, "Second": time.Second, "Minute": time.Minute}
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			t.Fatalf("README.md: redis.Options field without a name: %#v", elt)
		}
		name := kv.Key.(*ast.Ident).Name
		f := v.FieldByName(name)
		if !f.IsValid() {
			t.Fatalf("README.md: redis.Options has no field %s", name)
		}
		switch val := kv.Value.(type) {
		case *ast.BasicLit:
			switch val.Kind {
			case gotoken.STRING:
				s, _ := strconv.Unquote(val.Value)
				f.SetString(s)
			case gotoken.INT:
				n, _ := strconv.ParseInt(val.Value, 10, 64)
				f.SetInt(n)
			}
		case *ast.Ident:
			f.SetBool(val.Name == "true")
		case *ast.BinaryExpr:
			n, _ := strconv.ParseInt(val.X.(*ast.BasicLit).Value, 10, 64)
			f.SetInt(n * int64(units[val.Y.(*ast.SelectorExpr).Sel.Name]))
		default:
			t.Fatalf("README.md: redis.Options.%s: the test reads only literals and N * time.Unit", name)
		}
	}
	return o
}

// The README's Redis snippet works as printed: the client it builds is
// one NewTier accepts (NewTier refuses a client without
// ContextTimeoutEnabled, which the snippet once left out), and, with a
// Redis to talk to, a Loader through that tier loads and serves.
func TestReadmeRedisSnippet(t *testing.T) {
	lit, snippet := readmeClientOptions(t)
	o := readmeOptions(t, lit)

	bare := redis.NewClient(&redis.Options{Addr: o.Addr})
	defer bare.Close()
	if _, err := NewTier(bare, Options[string, string]{Prefix: "readme:"}); err == nil {
		t.Error("NewTier accepted a client without ContextTimeoutEnabled; the README's note about it is wrong")
	}

	rdb := redis.NewClient(&o)
	defer rdb.Close()
	tier, err := NewTier(rdb, Options[string, string]{Prefix: "readme:"})
	if err != nil {
		t.Fatalf("NewTier with the README's client options = %v; the snippet fails as printed:\n%s", err, snippet)
	}
	_ = tier.Close()

	// With a Redis, the same options (at its address) serve a Loader.
	addr := redisAddr(t)
	singleNodeOnly(t, "the README's snippet is a single-node client")
	o.Addr = addr
	rdb = redis.NewClient(&o)
	defer rdb.Close()
	prefix := testPrefix(t, rdb)
	tier, err = NewTier(rdb, Options[string, string]{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	l, err := flightcache.New(func(ctx context.Context, key string) (string, error) { return "price of " + key, nil },
		flightcache.Options[string, string]{TTL: time.Minute, StaleWhileRevalidate: 30 * time.Second, Remote: tier})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if v, err := l.Get(ctx, "p-1"); err != nil || v != "price of p-1" {
		t.Fatalf(`Get("p-1") = %q, %v; want "price of p-1"`, v, err)
	}
}
