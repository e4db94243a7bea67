package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/completer"
	"github.com/idemkit/idem/core/storekit"
)

// printer renders results as text for people or JSON for scripts.
type printer struct {
	w              io.Writer
	json           bool
	showKeys, body bool
}

// recordJSON is a record as idemctl prints it.
type recordJSON struct {
	Scope       string          `json:"scope"`
	KeyHash     string          `json:"key_hash"`
	Key         string          `json:"key,omitempty"` // -show-key(s) only
	Method      string          `json:"method"`
	Route       string          `json:"route"`
	Fingerprint string          `json:"fingerprint"`
	Status      storekit.Status `json:"status"`
	Token       int64           `json:"token"`
	Stuck       bool            `json:"stuck"`
	LeaseLeft   float64         `json:"lease_left_seconds"` // negative: lapsed that long ago
	LockedUntil time.Time       `json:"locked_until"`
	CreatedAt   time.Time       `json:"created_at"`
	ExpiresAt   time.Time       `json:"expires_at"`
	CompletedAt *time.Time      `json:"completed_at,omitempty"`
	Expired     bool            `json:"expired"`
	Waiters     bool            `json:"waiters"`
	Now         time.Time       `json:"db_now"`
	Response    *responseJSON   `json:"response,omitempty"`
	Steps       []stepJSON      `json:"steps,omitempty"` // processing records only
}

type stepJSON struct {
	Name        string  `json:"name"`
	ResultBytes int     `json:"result_bytes"`
	Result      *string `json:"result,omitempty"` // -body only
	// KeptRequest: the request core/completer re-sends is stored with
	// this step (not shown).
	KeptRequest bool `json:"kept_request,omitempty"`
}

type responseJSON struct {
	Status      int                 `json:"status"`
	Headers     map[string][]string `json:"headers"`
	BodyBytes   int                 `json:"body_bytes"`
	Body        *string             `json:"body,omitempty"` // -body only
	NotRetained bool                `json:"not_retained"`
}

func (p *printer) toJSON(r storekit.AdminRecord) recordJSON {
	out := recordJSON{
		Scope: r.Scope, KeyHash: core.RedactKey(r.Key), Method: r.Method, Route: r.Route, Fingerprint: r.Fingerprint,
		Status: r.Status, Token: r.Token, Stuck: r.Stuck(), LeaseLeft: r.LockedUntil.Sub(r.Now).Seconds(),
		LockedUntil: r.LockedUntil, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt,
		Expired: !r.ExpiresAt.After(r.Now), Waiters: r.Waiters, Now: r.Now,
	}
	if p.showKeys {
		out.Key = r.Key
	}
	if !r.CompletedAt.IsZero() {
		t := r.CompletedAt
		out.CompletedAt = &t
	}
	if r.Response != nil {
		h := r.Response.Header
		if h == nil {
			h = map[string][]string{}
		}
		out.Response = &responseJSON{Status: r.Response.Status, Headers: h, BodyBytes: len(r.Response.Body), NotRetained: r.Response.NotRetained}
		if p.body {
			b := string(r.Response.Body)
			out.Response.Body = &b
		}
	}
	return out
}

func (p *printer) emit(v any) int {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return exitFailure
	}
	return exitOK
}

func (p *printer) record(r storekit.AdminRecord, steps map[string][]byte) int {
	j := p.toJSON(r)
	names := make([]string, 0, len(steps))
	for n := range steps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		name, result, kept := completer.SplitStep(n, steps[n])
		sj := stepJSON{Name: name, ResultBytes: len(result), KeptRequest: kept}
		if p.body {
			v := string(result)
			sj.Result = &v
		}
		j.Steps = append(j.Steps, sj)
	}
	if p.json {
		return p.emit(j)
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	row := func(label, v string) { fmt.Fprintf(tw, "%s\t%s\n", label, v) }
	row("scope", fmt.Sprintf("%q", j.Scope))
	if j.Key != "" {
		row("key", j.Key)
	}
	row("key hash", j.KeyHash)
	status := string(j.Status)
	if j.Stuck {
		status += fmt.Sprintf(" — STUCK: lease lapsed %v ago", (-time.Duration(j.LeaseLeft * float64(time.Second))).Round(time.Millisecond))
	} else if j.Status == storekit.StatusProcessing {
		status += fmt.Sprintf(" — lease live for %v", time.Duration(j.LeaseLeft*float64(time.Second)).Round(time.Millisecond))
	}
	row("status", status)
	row("token", fmt.Sprint(j.Token))
	row("request", j.Method+" "+j.Route)
	row("fingerprint", j.Fingerprint)
	row("created", stamp(j.CreatedAt, j.Now))
	row("locked until", stamp(j.LockedUntil, j.Now))
	exp := stamp(j.ExpiresAt, j.Now)
	if j.Expired {
		exp += " (expired: the key is new again)"
	}
	row("expires", exp)
	if j.CompletedAt != nil {
		row("completed", stamp(*j.CompletedAt, j.Now))
	}
	row("waiters", fmt.Sprint(j.Waiters))
	for _, st := range j.Steps {
		v := fmt.Sprintf("%d bytes", st.ResultBytes)
		if st.Result != nil {
			v = *st.Result
		}
		if st.KeptRequest {
			v += " (the request is kept with it, for the completer)"
		}
		row("step "+st.Name, v)
	}
	if r := j.Response; r != nil {
		desc := fmt.Sprintf("%d, %d body bytes", r.Status, r.BodyBytes)
		if r.NotRetained {
			desc = fmt.Sprintf("%d, not retained (too large or streamed)", r.Status)
		}
		row("response", desc)
		names := make([]string, 0, len(r.Headers))
		for n := range r.Headers {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			for _, v := range r.Headers[n] {
				row("  "+n, v)
			}
		}
		if r.Body != nil {
			row("body", *r.Body)
		} else if r.BodyBytes > 0 {
			row("body", "(hidden; -body shows it)")
		}
	}
	_ = tw.Flush()
	return exitOK
}

func stamp(t, now time.Time) string {
	d := t.Sub(now).Round(time.Millisecond)
	rel := "in " + d.String()
	if d <= 0 {
		rel = (-d).String() + " ago"
	}
	return t.UTC().Format(time.RFC3339Nano) + " (" + rel + ")"
}

func (p *printer) records(rs []storekit.AdminRecord) int {
	list := make([]recordJSON, len(rs))
	for i, r := range rs {
		list[i] = p.toJSON(r)
	}
	if p.json {
		return p.emit(list)
	}
	if len(list) == 0 {
		fmt.Fprintln(p.w, "no stuck records")
		return exitOK
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKEY\tTOKEN\tLAPSED\tCREATED\tREQUEST")
	for _, j := range list {
		k := j.KeyHash
		if j.Key != "" {
			k = j.Key
		}
		lapsed := (-time.Duration(j.LeaseLeft * float64(time.Second))).Round(time.Millisecond)
		fmt.Fprintf(tw, "%q\t%s\t%d\t%v\t%s\t%s %s\n", j.Scope, k, j.Token, lapsed, j.CreatedAt.UTC().Format(time.RFC3339), j.Method, j.Route) // idem:showkey (-show-keys)
	}
	_ = tw.Flush()
	return exitOK
}

func (p *printer) released(scope, key string, token int64) int {
	if p.json {
		return p.emit(map[string]any{"released": true, "scope": scope, "key_hash": core.RedactKey(key), "token": token})
	}
	fmt.Fprintf(p.w, "released scope %q key %s (token %d): failed; a retry with the same request runs now\n", scope, core.RedactKey(key), token)
	return exitOK
}

func (p *printer) count(what string, n int) int {
	if p.json {
		return p.emit(map[string]any{what: n})
	}
	if what == "maintained" {
		fmt.Fprintln(p.w, "maintenance done")
	} else {
		fmt.Fprintf(p.w, "%s %d records\n", what, n)
	}
	return exitOK
}

type statsJSON struct {
	Now      time.Time    `json:"db_now"`
	Total    int64        `json:"total"`
	ByStatus []statusJSON `json:"by_status"`
}

type statusJSON struct {
	Status      storekit.Status `json:"status"`
	Count       int64           `json:"count"`
	UnderMinute int64           `json:"age_under_1m"`
	UnderHour   int64           `json:"age_1m_1h"`
	UnderDay    int64           `json:"age_1h_1d"`
	Older       int64           `json:"age_over_1d"`
	Expired     int64           `json:"expired"`
	Stuck       int64           `json:"stuck"`
	Oldest      *time.Time      `json:"oldest_created_at,omitempty"`
}

func (p *printer) stats(s storekit.Stats) int {
	out := statsJSON{Now: s.Now, ByStatus: []statusJSON{}}
	for _, c := range s.ByStatus {
		j := statusJSON{Status: c.Status, Count: c.Count, UnderMinute: c.UnderMinute, UnderHour: c.UnderHour,
			UnderDay: c.UnderDay, Older: c.Older, Expired: c.Expired, Stuck: c.Stuck}
		if !c.Oldest.IsZero() {
			t := c.Oldest
			j.Oldest = &t
		}
		out.Total += c.Count
		out.ByStatus = append(out.ByStatus, j)
	}
	if p.json {
		return p.emit(out)
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "STATUS\tCOUNT\t<1m\t<1h\t<1d\tOLDER\tEXPIRED\tSTUCK\t")
	for _, j := range out.ByStatus {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", j.Status, j.Count, j.UnderMinute, j.UnderHour, j.UnderDay, j.Older, j.Expired, j.Stuck)
	}
	fmt.Fprintf(tw, "total\t%d\t\t\t\t\t\t\t\n", out.Total)
	_ = tw.Flush()
	return exitOK
}
