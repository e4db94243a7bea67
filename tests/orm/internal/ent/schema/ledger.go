// Package schema is the ent schema of the orm tests' ledger.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/dialect/entsql"
	"entgo.io/ent/schema"
	"entgo.io/ent/schema/field"
)

// Ledger is one business row booked by a handler: its key.
type Ledger struct {
	ent.Schema
}

// Annotations names the table: ledger, as for the other ORMs.
func (Ledger) Annotations() []schema.Annotation {
	return []schema.Annotation{entsql.Annotation{Table: "ledger"}}
}

// Fields of the Ledger.
func (Ledger) Fields() []ent.Field {
	return []ent.Field{field.String("k")}
}
