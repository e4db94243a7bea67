// Package sqlitestore is a core.Store on SQLite.
package sqlitestore
